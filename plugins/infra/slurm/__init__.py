"""olmx's ``slurm`` infra plugin: runs a resolved plan as one Slurm batch job.

The Slurm-side machinery (render the sbatch script, submit, follow, cancel, read logs) is in
:mod:`olmx_plugins.infra.slurm.jobs`; this package module stays light so that loading the
plugin registry imports neither torch nor jinja2.
"""
