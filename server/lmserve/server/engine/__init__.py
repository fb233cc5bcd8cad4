"""Serving machinery between the API and the models: one `ServedModel` per model, whose compute
(`EngineCore`: scoring, generation, autocomplete) runs in an engine worker process of its own
(`workers`) or, in-process, on the model's own threads."""
