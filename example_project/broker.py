"""The embedded broker: kombu's filesystem transport, with each message written whole.

Real worker processes share one directory of message files, with nothing to install.
kombu's own ``_put`` creates the message file under its final name and then writes it,
so a consumer polling the directory can take the file while it is still empty: it
reads nothing, and the worker stops on a ``JSONDecodeError`` ("Unrecoverable error").
This transport writes the message under a name no consumer matches and renames it into
place (atomic on one filesystem), so a consumer sees a message whole or not at all.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

PATH = "example_project.broker:Transport"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f"partial-{name}.tmp")
        with open(partial, "wb") as out:
            out.write(str_to_bytes(dumps(payload)))
        os.replace(partial, final)


class Transport(filesystem.Transport):
    Channel = Channel
