"""TIGER-Lab/WebInstructSub.

Fields: ``question``, ``answer`` (+ orig_question, orig_answer, source, index). The prompt is ``question``.
Category ``science``.
"""

from __future__ import annotations

from datagen.prompts import single_field

ADAPTER = single_field("webinstruct", "question", "science", "TIGER-Lab/WebInstructSub")
