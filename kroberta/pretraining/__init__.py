"""The pretraining run (`train`: builds training/'s parts, resumes, fits) and the linear probe
of a pretrained model it scores at every checkpoint with `train.downstream` (`probe`)."""
