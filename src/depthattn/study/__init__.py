"""Studies: a grid of ``depthattn compare`` invocations described by one TOML file (``depthattn study``).

``spec`` reads a study file and expands it to named parts (one compare each); ``status`` says which parts are
done, running, interrupted or missing; ``runner`` trains the parts not done, a few at once on this machine or as a
SLURM job array (submitit), recording each start (``invocations``); ``publish`` writes one small file per part
done (``partfile``), to commit; ``report`` writes the study's tables (paired differences from the reference method over
seeds, trends across budgets and grid axes) from the parts' ``results.json``. ``published`` writes the report of a
published study (docs/results.md) from its study files and its parts' published files (``partfile``), with
``trend``, ``depth`` and ``groups``.
"""

from .spec import Part, Study, load_study

__all__ = ["Part", "Study", "load_study"]
