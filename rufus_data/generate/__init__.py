"""Generation behind one interface (`Generator.stream(prompts, sampling)`), three backends:

- `server`: any OpenAI-compatible endpoint(s) (server.py),
- `vllm`: a vLLM server Rufus starts and stops itself (launcher.py) + the server client,
- `hf`: transformers `generate` in-process (hf.py), the embedded default on CPU.

- base.py: the interface (`Generator`); sampling.py: sampling parameters and per-sample seeds.
- backend_config.py: each backend's settings, free of the backends' libraries.
- backends.py: `open_generator` picks one; `check_prompts_fit` runs the max_model_len check
  (context.py) before the first request.
- vllm_command.py: the command line of every vLLM server Rufus starts (launcher.py, rufus-train serve).

This package's own namespace holds only the light settings and types (no HTTP client, no arrow),
so a command line built from them starts fast."""

from __future__ import annotations

from rufus_data.generate.backend_config import ModelAccess, ServerLaunch
from rufus_data.generate.base import Completion, Generator, Prompt, PromptResult
from rufus_data.generate.sampling import SamplingParams, prompt_seed, sample_seed

__all__ = [
    "Completion",
    "Generator",
    "ModelAccess",
    "Prompt",
    "PromptResult",
    "SamplingParams",
    "ServerLaunch",
    "prompt_seed",
    "sample_seed",
]
