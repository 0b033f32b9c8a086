"""Fine-tuning and downstream evaluation of a pretrained model.

finetuning   `kroberta.finetune`: a task read, encoded, searched from each start
settings     `FinetuneConfig`: every setting and its default, the rates accepted (no JAX)
tasks        labelled files (TSV/CSV, JSON lines, Parquet, `datasets`), GLUE and the
             embedded task -> texts and label ids or values, with checks (no JAX)
encoding     tokenised (pairs as RoBERTa), padded into a few fixed-length buckets
classifiers  keras-hub's RobertaTextClassifier on the backbone, AdamW, the schedule
layer_decay  layer-wise learning-rate decay (the optimizer's per-layer rates)
starts       the weights a trial starts from: pretrained, random, adapted, re-drawn
adaptation   task-adaptive pretraining: masked-LM steps on the task's texts
search       the learning-rate x seed grid, widened at its edges; the best rate
trial        one trial (an evaluation per epoch, the best kept, NaN stops it) and the
             log of finished trials that resumes a fine-tune
results      Trial, FinetuneResult, and the pretrained start minus a random one
metrics      accuracy, F1, macro-F1, per-class scores, Matthews, Pearson, Spearman (numpy)
prediction   a fine-tuned classifier's probabilities and labels
model_files  `kroberta.load` (every source, either head) and a run's export
"""
