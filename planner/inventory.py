"""What the plan is made for: nodes and their GPUs (``--gpus 2xH100-80GB`` or a YAML file)."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from planner.catalog import Catalog, GpuType, load_catalog
from planner.errors import InventoryError

_TERM = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9_.@ -]*?)\s*$")


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[GpuType, ...] = ()

    @property
    def layout_key(self) -> tuple[str, ...]:
        """Nodes with the same key get the same placement (computed once)."""
        return tuple(f"{g.name}:{g.memory_bytes}:{g.estimates!r}" for g in self.gpus)


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    catalog: Catalog = field(repr=False, compare=False, default_factory=load_catalog)

    @classmethod
    def cpu_only(cls, node: str | None = None) -> Inventory:
        """A host without GPUs: plans CPU-only specs as one replica."""
        return cls(nodes=(Node(name=node or socket.gethostname()),))

    @classmethod
    def parse(cls, text: str, node: str = "node0", catalog: Catalog | None = None) -> Inventory:
        """``2xH100-80GB``, ``H200-141GB``, ``4xH100-80GB,2xL40S-48GB`` (one node), ``cpu``."""
        cat = catalog or load_catalog()
        return cls(nodes=(Node(name=node, gpus=parse_gpus(text, cat)),), catalog=cat)

    @classmethod
    def from_devices(
        cls, node: str, devices: list[tuple[str, int]], catalog: Catalog | None = None
    ) -> Inventory:
        """From detected GPUs: (name as NVML/torch reports it, total bytes) per device index."""
        cat = catalog or load_catalog()
        gpus = tuple(cat.match_device(name, int(total)) for name, total in devices)
        return cls(nodes=(Node(name=node, gpus=gpus),), catalog=cat)

    @classmethod
    def from_file(cls, path: Path | str, catalog: Catalog | None = None) -> Inventory:
        """A YAML inventory of (possibly many, heterogeneous) nodes.

        nodes:
          - {name: h100, count: 8, gpus: 8xH100-80GB}   # h100-0 .. h100-7
          - {name: l40s-a, gpus: 4xL40S-48GB}
        """
        p = Path(path)
        try:
            raw = yaml.safe_load(p.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise InventoryError(f"inventory {p}: {exc}") from None
        if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list):
            raise InventoryError(f"inventory {p}: expected a mapping with a 'nodes' list")
        extra = set(raw) - {"nodes", "catalog"}
        if extra:
            raise InventoryError(
                f"inventory {p}: unknown keys {sorted(extra)}; keys: catalog, nodes"
            )
        if catalog is None:
            cat_path = raw.get("catalog")
            catalog = load_catalog((p.parent / cat_path) if cat_path else None)
        nodes: list[Node] = []
        for i, entry in enumerate(raw["nodes"]):
            where = f"inventory {p}: nodes[{i}]"
            if not isinstance(entry, dict) or "name" not in entry:
                raise InventoryError(f"{where}: expected a mapping with 'name' and 'gpus'")
            bad = set(entry) - {"name", "gpus", "count"}
            if bad:
                raise InventoryError(
                    f"{where}: unknown keys {sorted(bad)}; keys: name, gpus, count"
                )
            count = entry.get("count", 1)
            if not isinstance(count, int) or count < 1:
                raise InventoryError(f"{where}: count must be a positive integer, got {count!r}")
            try:
                gpus = parse_gpus(str(entry.get("gpus") or "cpu"), catalog)
            except InventoryError as exc:
                raise InventoryError(f"{where}: {exc}") from None
            names = (
                [str(entry["name"])]
                if count == 1
                else [f"{entry['name']}-{k}" for k in range(count)]
            )
            nodes.extend(Node(name=n, gpus=gpus) for n in names)
        seen: set[str] = set()
        for n in nodes:
            if n.name in seen:
                raise InventoryError(f"inventory {p}: node name {n.name!r} appears twice")
            seen.add(n.name)
        if not nodes:
            raise InventoryError(f"inventory {p}: no nodes")
        return cls(nodes=tuple(nodes), catalog=catalog)


def parse_gpus(text: str, catalog: Catalog) -> tuple[GpuType, ...]:
    text = text.strip()
    if text.lower() in ("", "cpu", "none", "0"):
        return ()
    gpus: list[GpuType] = []
    for term in text.split(","):
        m = _TERM.match(term)
        if not m:
            raise InventoryError(
                f"cannot read GPUs {term!r}: expected COUNTxTYPE, e.g. 2xH100-80GB"
            )
        count = int(m.group(1) or 1)
        if count < 1:
            raise InventoryError(f"GPU count must be at least 1 in {term!r}")
        gpus.extend([catalog.get(m.group(2))] * count)
    return tuple(gpus)


def resolve_inventory(inventory: str | Path | Inventory | None) -> Inventory:
    """Accepted forms: None (CPU-only host), an Inventory, a YAML path, a --gpus string."""
    if inventory is None:
        return Inventory.cpu_only()
    if isinstance(inventory, Inventory):
        return inventory
    if isinstance(inventory, Path) or (
        isinstance(inventory, str) and inventory.endswith((".yaml", ".yml"))
    ):
        return Inventory.from_file(inventory)
    return Inventory.parse(inventory)
