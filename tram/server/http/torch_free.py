"""Keep the API server process free of torch.

The API process only tokenizes, detokenizes and streams; the model runs in the engine core process.
But transformers 5 imports torch as soon as any config class loads (configuration_utils imports
modeling_rope_utils, which imports torch when it is installed), and AutoTokenizer loads a config to
pick the tokenizer class. That would cost the API process seconds of start-up and hundreds of MB for
nothing. transformers supports running without torch (a tokenizers-only install), so this process
tells it torch is absent. Only the API process calls this, before it first imports transformers'
config or tokenizer classes; the engine core is a fresh (spawned) process and sees the real torch.
"""

from __future__ import annotations

import sys


def keep_transformers_torch_free() -> bool:
    """Make transformers behave as in an install without torch; False if torch is already loaded."""
    if "torch" in sys.modules:
        return False
    import transformers.utils as utils
    import transformers.utils.import_utils as import_utils

    def torch_unavailable() -> bool:
        return False

    # Modules imported from here on bind whichever of the two names they import.
    import_utils.is_torch_available = torch_unavailable
    utils.is_torch_available = torch_unavailable
    return True
