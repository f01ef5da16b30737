"""What every stage process imports before it loads anything: imported once, in the fork server
that stage processes are forked from (``worker.runtime.process``), instead of once per process.

On two cores, six stage processes each importing torch and transformers made a local fleet's
start-up mostly import time. Importing torch does not initialise CUDA, so processes forked
afterwards still choose their GPUs (``CUDA_VISIBLE_DEVICES``) and thread counts themselves.
"""

import torch  # noqa: F401
import transformers  # noqa: F401
from transformers import modeling_utils, processing_utils  # noqa: F401
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe  # noqa: F401
