"""Pretrain a RoBERTa MLM: `python -m kroberta.train [--config FILE] [--section.key=value ...]`.

With no arguments it runs the embedded default job: a small model on a corpus made
from the Python standard library's docstrings, a few minutes on a laptop CPU.
Re-running the same command resumes from the run directory's latest checkpoint.
The Python API is `kroberta.train(config)` (kroberta/pretraining/train.py).
"""

import argparse

import kroberta
from kroberta import cli
from kroberta.config import Config, from_command_line, validate
from kroberta.interop.checkpoint_config import with_checkpoint_model

# JAX, Keras and TensorFlow are imported by the functions that use them, so that
# `--help`, config errors and `--explain` answer without their seconds of start-up.


def parse_args(argv: list[str]) -> tuple[Config, argparse.Namespace]:
    parser = cli.ArgumentParser(
        prog="python -m kroberta.train",
        description="Pretrain a RoBERTa masked-language model. Any config key can be "
        "overridden as --section.key=value (e.g. --train.steps=4114 --run_dir=runs/x).",
    )
    parser.add_argument(
        "--config",
        help="a shipped config by name (base, seed, small, tiny: "
        "kroberta/configs/) or the path of a TOML file",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="start over in a run_dir that holds a run of a different model "
        "or with other training settings",
    )
    parser.add_argument(
        "--accept-changes",
        action="store_true",
        help="continue a run_dir's checkpoint with changed training settings "
        "(learning rate, steps, data, ...); recorded in config_changes.jsonl",
    )
    parser.add_argument(
        "--until-step",
        type=int,
        metavar="N",
        help="stop after step N with a checkpoint (the learning-rate schedule "
        "still spans train.steps); re-run to continue",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print parameters, FLOPs, memory and shape advice, then exit",
    )
    parser.add_argument(
        "--no-examples",
        action="store_true",
        help="do not print fill-mask examples at the end of the default job",
    )
    args, rest = parser.parse_known_args(argv)
    config, args.sources = from_command_line(args.config, rest)
    return config, args


# Fill-mask examples printed at the end of the embedded default job, in the register of
# the standard library's docstrings (its corpus).
EXAMPLES = (
    "Return the number <mask> items in the list.",
    "If the file does not exist, an <mask> is raised.",
    "Return True if the object is an instance <mask> the class.",
    "The default value <mask> None.",
    "This method returns a <mask> of strings.",
)


def _print_examples(run_dir: str, top_k: int = 3):
    model = kroberta.load(run_dir)
    results = kroberta.fill_mask(model, list(EXAMPLES), top_k=top_k)
    print(f"fill-mask examples (top {top_k}):")
    for sentence, candidates in zip(EXAMPLES, results):
        guesses = ", ".join(f"{c['token_str'].strip()!r} {c['score']:.2f}" for c in candidates)
        print(f"  {sentence}\n      -> {guesses}")


def _train(argv) -> int:
    # start-up: `--help` and config errors answer before JAX and Keras load
    from kroberta.pretraining.train import Outcome, train

    config, args = parse_args(argv)
    # --init_from_hf / --init_from_keras_hub: the model section is the checkpoint's.
    config, args.sources = with_checkpoint_model(config, args.sources)
    if args.explain:  # kroberta.perf.advisor: trains nothing, creates no run dir
        # start-up: JAX and the model load for --explain only
        from kroberta.perf import advisor

        config = validate(config, args.sources or "config")
        for line in advisor.explain(config):
            print(line, flush=True)
        return 0
    summary = train(
        config,
        force=args.force,
        until_step=args.until_step,
        sources=args.sources,
        accept_changes=args.accept_changes,
    )
    if summary["outcome"] is Outcome.PREEMPTED:
        return cli.PREEMPTED
    if not config.data.train and not config.data.dir and not args.no_examples:
        _print_examples(config.run_dir)
    return 0


def main(argv=None) -> int:
    # On KeyboardInterrupt mid-fit, train() has said which checkpoint is kept and how to resume.
    return cli.run(
        lambda: _train(argv),
        when_out_of_memory=(
            "--train.batch_size_per_device (--train.gradient_accumulation_steps keeps the global "
            "batch), or set --train.remat=full"
        ),
    )
