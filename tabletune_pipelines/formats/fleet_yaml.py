"""Reading a fleet file's YAML strictly: a regular UTF-8 file of at most ``MAX_FLEET_BYTES``, and
``StrictLoader``, which refuses a key written twice in one mapping, aliases, merge keys and integers
longer than ``strict_io.MAX_INT_DIGITS``, each naming its line. ``read_fleet_yaml`` returns the parsed
document; ``formats.fleet`` validates it against the schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tabletune_pipelines.errors import FleetError
from tabletune_pipelines.formats.strict_io import MAX_INT_DIGITS, FileTooLargeError, NotRegularFileError, read_bounded

__all__ = ["MAX_FLEET_BYTES", "StrictLoader", "read_fleet_yaml"]

#: A fleet file is a few kB; a larger one is not a fleet file.
MAX_FLEET_BYTES = 4 * 1024 * 1024


class _YAMLRefused(yaml.YAMLError):
    """YAML that a fleet file may not use (a duplicate key, an alias, a merge key)."""

    def __init__(self, what: str, mark: Any) -> None:
        super().__init__(what)
        self.what, self.line = what, (mark.line + 1 if mark is not None else None)


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys, aliases and merge keys (each names its line)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _YAMLRefused(f"alias *{event.anchor} (a fleet file may not use YAML aliases or anchors; write "
                               "the value out)", event.start_mark)
        return super().compose_node(parent, index)

    def construct_yaml_int(self, node: Any) -> Any:
        # Python refuses to build an integer of more than 4300 decimal digits (a ValueError), and a
        # long one is no fleet value: the bound every reader has (strict_io.MAX_INT_DIGITS).
        digits = len(str(node.value).lstrip("+-").replace("_", ""))
        if digits > MAX_INT_DIGITS:
            raise _YAMLRefused(f"an integer of {digits} digits (at most {MAX_INT_DIGITS} are allowed)", node.start_mark)
        return super().construct_yaml_int(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise _YAMLRefused("merge key '<<' (write the keys out)", key_node.start_mark)
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in first:
                        raise _YAMLRefused(f"key {key!r} appears twice in one mapping (first on line {first[key]}); "
                                           "write each key once", key_node.start_mark)
                    first[key] = key_node.start_mark.line + 1
                except TypeError:
                    pass  # an unhashable key: SafeLoader names it below
        return super().construct_mapping(node, deep)


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


def read_fleet_yaml(p: Path) -> Any:
    """The YAML document of the fleet file ``p``, read strictly; every refusal is a ``FleetError``
    naming the file (and the line, where YAML has one)."""
    try:
        raw, _ = read_bounded(p, MAX_FLEET_BYTES)  # a regular file only: a named pipe is never waited on
    except FileNotFoundError:
        raise FleetError(f"fleet file {p} does not exist (set TABLETUNE_FLEET or pass --fleet)") from None
    except IsADirectoryError:
        raise FleetError(f"fleet file {p} is a folder; pass the YAML file (set TABLETUNE_FLEET or --fleet)") from None
    except NotRegularFileError as exc:
        raise FleetError(f"fleet file {p} is {exc.kind}, not a regular file; it was not read. Pass the YAML "
                         "file (set TABLETUNE_FLEET or --fleet)") from None
    except FileTooLargeError:
        raise FleetError(f"fleet file {p} is larger than {MAX_FLEET_BYTES} bytes; not a fleet file") from None
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {p}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise FleetError(f"fleet file {p} is not UTF-8 text (bad byte at offset {exc.start}, line {line}); "
                         "re-encode it as UTF-8") from None
    try:
        data = yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _YAMLRefused as exc:
        raise FleetError(f"fleet file {p}, line {exc.line}: {exc.what}") from None
    except yaml.YAMLError as exc:
        raise FleetError(f"fleet file {p} is not valid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise FleetError(f"fleet file {p} is nested too deeply to be a fleet file") from None
    except ValueError as exc:  # a value YAML itself cannot build (the integer bound above catches the known one)
        raise FleetError(f"fleet file {p} is not valid YAML: {' '.join(str(exc).split())[:200]}") from None
    return data
