"""The masked-language model: building it, loss and metrics, schedules, saving and loading, fast CPU layers."""
