"""Building blocks the model families share, in the role of SGLang's ``srt/layers``: the Qwen3
decoder (``qwen3_decoder``), loading a stage's tensors from a checkpoint's safetensors
(``stage_weights``: which shards, which names) into a module tree with a strict name check
(``module_weights``). A family imports these; nothing here imports a family, a stage, an
engine or the runtime."""
