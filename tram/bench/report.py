"""What every benchmark report records about where it ran."""
from __future__ import annotations

import datetime
import os
import platform


def machine_info() -> dict[str, object]:
    import torch

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
