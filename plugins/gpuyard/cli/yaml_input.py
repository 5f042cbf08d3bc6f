"""Reading a YAML (or JSON) document a user hands the CLI, safely.

Only plain data (yaml.SafeLoader), at most MAX_BYTES (the API's own body limit), and no aliases: an
alias is a reference, and a 495-byte document of nested aliases expands to 1.4 GB once anything walks
it (the "billion laughs"). A JobSpec has no need for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20


class DocumentError(ValueError):
    """The file is too big, not YAML, or uses what this reader refuses; the message says which."""


class _NoAliases(yaml.SafeLoader):
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise DocumentError(
                f"line {mark.line + 1}, column {mark.column + 1}: aliases (*name) are not allowed; "
                "write the value out"
            )
        return super().compose_node(parent, index)


def load_document(path: Path) -> Any:
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise DocumentError(f"{path}: {size} bytes, over the limit of {MAX_BYTES}")
    try:
        return yaml.load(path.read_text(), Loader=_NoAliases)  # a SafeLoader
    except DocumentError as error:
        raise DocumentError(f"{path}: {error}") from None
    except yaml.YAMLError as error:
        raise DocumentError(f"{path}: not valid YAML: {error}") from None
