"""Plot a run's metrics.jsonl into report.png and print its summary.

python -m kroberta.report runs/x
"""

from kroberta import cli
from kroberta.training.report import report


def main(argv=None) -> int:
    parser = cli.ArgumentParser(
        prog="python -m kroberta.report", description="Plot a run's metrics.jsonl into report.png."
    )
    parser.add_argument("run_dir", help="a run directory (holds metrics.jsonl)")
    args = parser.parse_args(argv)

    def body():
        report(args.run_dir)  # its summary (a dict) is not an exit code

    return cli.run(body, messages="stdout")  # the summary is the command's output
