"""What a run decides from its validation losses: the best checkpoint (`train.keep_best`)
and when to end early (`train.early_stop_patience`, `train.target_eval_loss`).

Every decision is a function of the validation rows in metrics.jsonl, so a resumed
run (whose rows after its checkpoint were dropped) decides exactly as an
uninterrupted one, and every process of a job (which all see the same evaluation)
decides alike.
"""

from kroberta.training import checkpoint
from kroberta.training.run_dir import metrics_rows

EARLY_STOP = "early_stop"  # the split of the row that records an early stop


def validation_losses(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, loss) of the evaluations after training began: the one at step 0 (a run
    started from a checkpoint logs its loss before the first step) has no checkpoint to
    keep and does not count for the best one or the early stop."""
    return [
        (r["step"], r["loss"])
        for r in rows
        if r.get("split") == "validation"
        and r["step"] > 0
        and isinstance(r.get("loss"), (int, float))
    ]


class EvalWatch:
    """Follows the validation losses: the best so far, and whether the run should end.

    Args:
        train: the run's `TrainConfig` (keep_best, early_stop_patience, target_eval_loss).
        history: the (step, loss) evaluations before this invocation, oldest first.
    """

    def __init__(self, train, history=()):
        self.train = train
        self.best = None  # (step, loss) of the lowest validation loss so far
        self.since_best = 0  # evaluations since the best one
        for step, loss in history:
            self.record(step, loss)

    def record(self, step: int, loss: float) -> str | None:
        """Takes the evaluation at `step`; returns why the run ends here, or None."""
        if self.best is None or loss < self.best[1]:
            self.best, self.since_best = (step, loss), 0
        else:
            self.since_best += 1
        t = self.train
        if t.target_eval_loss and loss <= t.target_eval_loss:
            return (
                f"validation loss {loss:.4g} reached train.target_eval_loss={t.target_eval_loss:g}"
            )
        if t.early_stop_patience and self.since_best >= t.early_stop_patience:
            return (
                f"validation loss has not improved on {self.best[1]:.4g} (step "
                f"{self.best[0]}) for {self.since_best} evaluation(s) "
                f"(train.early_stop_patience={t.early_stop_patience})"
            )
        return None

    @property
    def best_step(self) -> int | None:
        return self.best[0] if self.best else None


def ended_early(rows: list[dict], step: int, train) -> str | None:
    """Why a run resumed at `step` with the metrics `rows` up to there ends there under
    the settings of `train` (its evaluations replayed), or None when it trains on."""
    history = validation_losses(rows)
    if not history or history[-1][0] != step or step >= train.steps:
        return None
    return EvalWatch(train, history[:-1]).record(*history[-1])


def best_checkpoint(run_dir: str) -> tuple[int, str, float] | None:
    """(step, path, validation loss) of the kept checkpoint with the lowest validation
    loss, or None when no kept checkpoint was evaluated."""
    kept = dict(checkpoint.list_checkpoints(run_dir))
    evaluated = [
        (loss, step) for step, loss in validation_losses(metrics_rows(run_dir)) if step in kept
    ]
    if not evaluated:
        return None
    loss, step = min(evaluated)
    return step, kept[step], loss
