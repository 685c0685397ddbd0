"""A library's module-level settings, as a model reads them (`settings.SCALE`): installed_cases'
LibrarySettingChild reads them, and a serving process may change them before or after load."""
from __future__ import annotations

import torch

SCALE = 2.0
FAST_PATH = True
DTYPE = torch.float32
WEIGHTS = [1.5]
LIMIT = float("inf")
