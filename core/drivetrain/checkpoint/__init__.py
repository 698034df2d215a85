"""Checkpoints that never lose work. ``drivetrain.checkpointing`` re-exports the public names.

files.py            checkpoint file writes, fsync, checksums
serialization.py    safetensors streaming, safe unpickling, shard planning
manifest.py         manifests: writing, reading within bounds, verifying
publishing.py       putting a finished save in place: a new folder, or an existing one shared with the user
rotation.py         automatic checkpoints: one writer per project_dir, the newest that verifies, pruning
finishing.py        finishing a save (durable, manifest, rename) in the background
training_objects.py which object goes in which file, and the reference backend's save/load
state_checks.py     whether a saved state fits the object it is for, checked before anything is applied
dcp_reading.py      reading torch.distributed.checkpoint folders safely and within bounds
model_files.py      save_model's single-file / sharded layout
checkpointer.py     the Checkpointer: save_state / load_state of one Accelerator
"""
