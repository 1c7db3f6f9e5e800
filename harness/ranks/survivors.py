"""What a rank keeps between calls, kept out of the cyclic collector's way.

A rank that serves test after test holds more every call: each family's modules, the warm caches' entries. Every
full collection walks all of it: 255,000 objects after ten training cases, 0.13-0.36 s a reset on a 2-core
machine, per call and per rank, and more inside the calls (Python's own full collections). After each reset the
rank moves what survived to the collector's permanent generation (`gc.freeze`): later collections and the scan
for live meshes walk only what later calls make. A frozen object is still freed when its last reference goes;
only a reference cycle that includes one waits, until the rank's next `thaw`: when, the caches cleared (after a
failed call, or past the groups' bound), a mesh still names a group. harness.ranks.rank breaks the one such cycle
known to hold meshes (DTensor's cached redistribution planners) before it clears them, so that costs no thaw.

No scan of the heap sees a frozen object, so the meshes alive at a freeze are remembered by weak reference: a
group one of them names is never destroyed while it lives (harness.ranks.rank destroys a call's groups only when
no live mesh names them).
"""

from __future__ import annotations

import gc
import sys
import weakref


class Survivors:
    def __init__(self) -> None:
        self._frozen_meshes: list[weakref.ref] = []

    def freeze(self) -> None:
        """Move every object alive now out of later collections, remembering the meshes among them."""
        meshes = self.live_meshes()
        gc.freeze()
        self._frozen_meshes = [weakref.ref(mesh) for mesh in meshes]

    def thaw(self) -> None:
        """Put every object back in the collector's generations (and in the heap's scans): the next collection
        frees cycles that include what was frozen."""
        gc.unfreeze()
        self._frozen_meshes = []

    def live_meshes(self) -> list:
        """Every DeviceMesh alive, flattened ones included (they are meshes too)."""
        mesh_type = getattr(sys.modules.get("torch.distributed.device_mesh"), "DeviceMesh", None)
        if not isinstance(mesh_type, type):
            return []
        # type(), not isinstance(): DeviceMesh's metaclass would read attributes of every object (and warn).
        meshes = {id(obj): obj for obj in gc.get_objects() if issubclass(type(obj), mesh_type)}
        for reference in self._frozen_meshes:
            mesh = reference()
            if mesh is not None:
                meshes[id(mesh)] = mesh
        return list(meshes.values())

    def named_groups(self) -> set[str]:
        """The names of the process groups that some live mesh refers to."""
        return {name for mesh in self.live_meshes() for name in getattr(mesh, "_dim_group_names", ())
                if isinstance(name, str)}
