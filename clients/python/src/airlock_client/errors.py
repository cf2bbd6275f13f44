"""The one exception the client raises: a failure with Airlock's stable code."""

from __future__ import annotations


class AirlockError(Exception):
    """A failure the daemon reported, with its stable code, message and hint."""

    def __init__(self, code: str, message: str, hint: str = "", status: int = 0):
        super().__init__(f"{message} ({code}){': ' + hint if hint else ''}")
        self.code = code
        self.message = message
        self.hint = hint
        self.status = status
