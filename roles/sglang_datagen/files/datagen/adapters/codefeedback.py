"""m-a-p/CodeFeedback-Filtered-Instruction.

Fields: ``query``, ``answer``, ``resource``, ``lang``. The prompt is ``query``. Category ``coding``.
"""

from __future__ import annotations

from datagen.prompts import single_field

ADAPTER = single_field("codefeedback", "query", "coding", "m-a-p/CodeFeedback-Filtered-Instruction")
