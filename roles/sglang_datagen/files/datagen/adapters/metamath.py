"""meta-math/MetaMathQA.

Fields: ``query``, ``response``, ``type``, ``original_question``. The prompt is ``query``. Category ``math``.
"""

from __future__ import annotations

from datagen.prompts import single_field

ADAPTER = single_field("metamath", "query", "math", "meta-math/MetaMathQA")
