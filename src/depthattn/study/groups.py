"""The small-scale study's groups, one record each (``studies/small-scale/GROUP.toml`` defines a group's parts,
``published`` reports them): where a group's runs train, whose ``none`` they are paired with, its section title, and, for a CPU twin,
the group whose runs it repeats on the CPU. ``GROUPS`` is in the report's order. The learning-rate study's groups
(``lr_study``: the sweep ``lr1cpu`` and the tuned 4 × runs ``lr4cpu``, ``lr4cpunb``) are reported by one section of
their own (``lrsweep``), not by a group table each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Group:
    name: str
    #: The section title in docs/results.md.
    title: str
    #: The device setting (``TrainConfig.device``) its published runs trained with: "cuda" (on a GPU) or "auto" (on
    #: a machine without CUDA, so the CPU). Pairing compares the setting itself (``trend.PAIRABLE_DIFFERENCES``
    #: leaves device out: a fresh run draws its initial weights on its device), so a part trains with its group's.
    device: str
    #: The group whose ``none`` runs are this group's baseline ("" = its own).
    base: str = ""
    #: For a CPU twin: the group whose parts it repeats on the CPU (same methods, seeds and budget; never paired
    #: with them, shown beside them in a cross-check).
    twin_of: str = ""
    #: A group of the learning-rate study: reported by ``lrsweep``'s section (its runs differ in ``lr`` by design),
    #: not by a table of its own.
    lr_study: bool = False
    #: Its study file may be absent: the group then has nothing to train (a tuned 4 × group whose every rate is
    #: the shared one, whose runs ``mix4cpu`` has).
    optional: bool = False

    @property
    def baseline_group(self) -> str:
        return self.base or self.name


GROUPS: dict[str, Group] = {g.name: g for g in (
    Group("mix16", "Public-domain mix, 16 × the default budget (6.55 M tokens), trained on the GPU (paired among "
                   "themselves)", "cuda"),
    Group("mix4", "Public-domain mix, 4 × the default budget (1.64 M tokens), trained on the GPU (paired among "
                  "themselves)", "cuda"),
    Group("mix1", "Public-domain mix, the default budget (409,600 tokens), trained on the GPU (paired among "
                  "themselves)", "cuda"),
    Group("mix16cpu", "Public-domain mix, 16 ×, trained on the 2-core CPU (paired among themselves; the cross-check "
                      "below)", "auto", twin_of="mix16"),
    Group("mix4cpu", "Public-domain mix, 4 ×, trained on the 2-core CPU (paired among themselves; the cross-check "
                     "below)", "auto", twin_of="mix4"),
    Group("mix1cpu", "Public-domain mix, the default budget, trained on the 2-core CPU (paired among themselves; the "
                     "cross-check below)", "auto", twin_of="mix1"),
    Group("main", "Embedded corpus: default budget", "auto"),
    Group("loops", "Embedded corpus: looped models (`--loops 2`)", "auto"),
    Group("ablation", "Embedded corpus: Depth-Attention candidate-set ablation (default budget, paired with main's "
                      "none)", "auto", base="main"),
    Group("long", "Embedded corpus: longer budget (4 × the default tokens; 2 epochs of the corpus)", "auto"),
    Group("lr1cpu", "Public-domain mix, the default budget, trained on the 2-core CPU at four learning rates (the "
                    "learning-rate sweep)", "auto", lr_study=True),
    Group("lr4cpu", "Public-domain mix, 4 ×, trained on the 2-core CPU, each method at its best learning rate of the "
                    "sweep", "auto", lr_study=True, optional=True),
    Group("lr4cpunb", "Public-domain mix, 4 ×, trained on the 2-core CPU, none and depth_attention at the "
                      "neighbouring learning rate of their best", "auto", lr_study=True, optional=True),
)}


#: The groups in the order their parts are listed (the order they were trained in): the embedded corpus's, then the
#: budget study on the GPU, 16 x first, then its CPU twins in the same order, then the learning-rate study on the
#: CPU (the sweep at 1 x, then the tuned runs at 4 x).
RUN_ORDER = ("main", "loops", "ablation", "long", "mix16", "mix1", "mix4", "mix16cpu", "mix1cpu", "mix4cpu",
             "lr1cpu", "lr4cpu", "lr4cpunb")


def lr_groups() -> tuple[str, ...]:
    """The learning-rate study's groups (``Group.lr_study``), in ``GROUPS``' order: ``("lr1cpu", "lr4cpu",
    "lr4cpunb")``."""
    return tuple(g.name for g in GROUPS.values() if g.lr_study)


def cpu_twin_group(name: str) -> str | None:
    """The group that repeats group ``name``'s runs on the CPU, or None."""
    return next((g.name for g in GROUPS.values() if g.twin_of == name), None)


def budget_sets() -> dict[str, tuple[str, ...]]:
    """The budget study's two sets of groups, by where they train: ``{"on the GPU": ("mix16", "mix4", "mix1"),
    "on the 2-core CPU": ("mix16cpu", "mix4cpu", "mix1cpu")}`` (the GPU's groups are those a CPU twin repeats;
    each set in ``GROUPS``' order). The two are never paired with each other."""
    cpu = tuple(g.name for g in GROUPS.values() if g.twin_of)
    return {"on the GPU": tuple(GROUPS[g].twin_of for g in cpu), "on the 2-core CPU": cpu}


def set_order(parts: list, done: set[str]) -> list[str]:
    """The keys of ``budget_sets``, the set with the smaller share of its ``parts`` (``published.Planned``) not in
    ``done`` first (the GPU's on a tie): the report leads with the more complete set."""
    def missing_share(groups: tuple[str, ...]) -> float:
        mine = [p for p in parts if p.group in groups]
        return sum(p.name not in done for p in mine) / max(len(mine), 1)
    return sorted(budget_sets(), key=lambda where: missing_share(budget_sets()[where]))
