"""The record format, the tf.data input pipeline, masking, record validation, the manifest."""
