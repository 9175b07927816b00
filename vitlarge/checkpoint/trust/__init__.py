"""The trust layer: every check of a checkpoint file that comes from elsewhere, one module per file kind.

Checkpoints are handed between people (a colleague's run, a shared workdir, a copy from another machine), so
nothing in one is trusted before it passes here: not its names, links, sizes, types or the objects a pickle in
it would build. What is trusted: this process's own writes before they are published (`vitlarge.checkpoint.store`
checksums them into meta.json) and the libraries that read a file once it has passed (torch's
``weights_only`` unpickler, safetensors, DCP's reader over byte ranges checked here).

One entry per file kind:

* ``meta.json`` -- `meta.read` (a regular file of at most ``META_MAX_BYTES``, never a link, FIFO or device;
  `meta.problem_of`: every key's type and range, every listed name a plain file name of a kind a checkpoint
  holds, so every read it leads to stays in the folder); `layout.read_meta` raises it as `layout.Unusable`.
* ``checkpoints/step_*`` folder names -- `layout` (``meta.STEP_DIR``; a step from a name, never a path).
* a checkpoint folder as a whole -- `folder.verify`: never a symbolic link, meta.json, then every listed file's size
  and CRC32C and the index below; the one check of the resume and of every reader of a checkpoint's weights.
* ``.metadata`` (DCP's index, a pickle) -- `index.read_index`: a restricted unpickler admitting an exact list of
  (module, name) pairs, every opcode charged to `pickles.Budget`, then `index.index_problem` against
  meta.json's listing.
* each byte range of a ``.distcp`` file -- `index.slices_problem` / `index.archive_problem`.
* ``rank_NNNNN.pt`` -- `torch_files.torch_load` (size cap, `index.archive_problem`, ``weights_only``) then
  `torch_files.rank_state_problem` (key by key).
* ``model.safetensors``, ``optimizer.pt``, ``optimizer_rank_NNNNN.pt`` (formats 1 and 2) --
  `torch_files.safetensors_file`, `torch_files.torch_load` then `torch_files.optimizer_state_problem`.

Every file a listing names is stat'ed against its recorded size (`vitlarge.fileio.size_problem`, which refuses a
symlink or a FIFO under a listed name) before it is read. A file that fails raises `layout.Unusable` (a one-line
``UserError`` naming the folder and the problem) or its module's own error (`index.IndexProblem`), never
a library's traceback or its advice to unpickle the file anyway.
"""
