"""Fine-tuning and downstream evaluation of a pretrained model.

    examples    a task's labelled files (TSV/CSV, JSON lines, Parquet, `datasets`) -> texts,
                label ids or values, with checks
    glue        the GLUE tasks as their standard directories hold them
    stdlib_task the embedded task: which part of the standard library a docstring is from
    encoding    tokenised (pairs as RoBERTa), padded into a few fixed-length buckets
    metrics     accuracy, F1, macro-F1, per-class scores, Matthews, Pearson, Spearman (numpy)
    classifiers keras-hub's RobertaTextClassifier on the backbone, AdamW, the schedule
    rate_grid   the learning rates accepted, and how a grid widens (no JAX: checked first)
    trial_run   one trial: an evaluation per epoch, the best epoch kept, NaN stops it
    recipe      the learning-rate x seed grid, widened at its edges: `kroberta.finetune`
    trials      the finished trials kept in --out, so an interrupted fine-tune resumes
    verdict     the pretrained start minus a random start, with a bootstrap interval
    prediction  probabilities and labels of a fine-tuned classifier; saving and loading it
    probe       a ridge probe on the frozen model's pooled embeddings (cheap, no training)
"""
