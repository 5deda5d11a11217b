"""Save / restore (config, params) with orbax.

Layout of a saved directory ``path``::

    path/config.json   dataclasses.asdict(ModelConfig) (tuples stored as JSON lists)
    path/params/       orbax StandardCheckpointer checkpoint of the param tree

Restore rebuilds the exact tree (dicts, the ``layers`` list), shapes and dtypes, onto the default
device, and checks it against ``param_shapes(config)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp

from mtpspec import sharding as mtp_sharding
from mtpspec.config import ModelConfig, check_dtype
from mtpspec.models.params import check_param_tree

CONFIG_FILE = "config.json"
PARAMS_DIR = "params"


@contextlib.contextmanager
def keep_root_logging():
    """Leave the root logger's handlers as they were. orbax logs through absl, and absl calls
    ``logging.basicConfig()`` when the root logger has no handler — which would configure the
    user's logging for them (and make their own ``basicConfig`` a no-op); a handler added so
    inside the block is removed again."""
    before = list(logging.root.handlers)
    try:
        yield
    finally:
        if not before:
            for h in list(logging.root.handlers):
                fmt = getattr(h.formatter, "_fmt", None)
                if isinstance(h, logging.StreamHandler) and fmt == logging.BASIC_FORMAT:
                    logging.root.removeHandler(h)


@contextlib.contextmanager
def _checkpointer():
    """An orbax StandardCheckpointer (orbax imported on first use), under ``keep_root_logging``."""
    with keep_root_logging():
        import orbax.checkpoint as ocp

        with ocp.StandardCheckpointer() as ckptr:
            yield ckptr


def _config_from_dict(d) -> ModelConfig:
    if not isinstance(d, dict):
        raise ValueError(f"saved config must be a JSON object, got {type(d).__name__}")
    fields = dataclasses.fields(ModelConfig)
    unknown = sorted(set(d) - {f.name for f in fields})
    if unknown:
        raise ValueError(f"saved config has unknown fields {unknown}")
    required = [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in d]
    if missing:
        raise ValueError(f"saved config lacks required fields {missing}")
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    try:
        return ModelConfig(**d)
    except TypeError as e:  # a field of the wrong type, e.g. a string where a count belongs
        raise ValueError(f"saved config is not a valid ModelConfig: {e}") from e


# save_params writes beside the target and renames (see there)
SAVING_SUFFIX = ".saving"
REPLACED_SUFFIX = ".replaced"


def save_params(
    path: str | os.PathLike, config: ModelConfig, params: dict, *, overwrite: bool = False
) -> None:
    """Write ``config`` (JSON) and ``params`` (orbax) under directory ``path``.

    Atomic for the directory: everything is written beside it (``path`` + ".saving") and renamed
    into place once complete, so a save that fails (disk full, a crash, an exception) leaves any
    earlier checkpoint at ``path`` intact; with ``overwrite`` the old one is removed only after the
    new one is in place."""
    path = os.path.abspath(os.fspath(path))
    check_param_tree(config, params)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path} already exists (pass overwrite=True to replace it)")
    tmp, old = path + SAVING_SUFFIX, path + REPLACED_SUFFIX
    # Multi-host (shared filesystem): process 0 alone prepares the directory and writes the
    # config; then every process joins orbax's save of its own shards; process 0 renames.
    lead = jax.process_index() == 0
    if lead:
        shutil.rmtree(tmp, ignore_errors=True)  # a save that died earlier
        os.makedirs(tmp)
        with open(os.path.join(tmp, CONFIG_FILE), "w") as f:
            json.dump(dataclasses.asdict(config), f, indent=2)
    _sync(f"mtpspec save_params {path} start")
    try:
        with _checkpointer() as ckptr:
            ckptr.save(os.path.join(tmp, PARAMS_DIR), params)
    except BaseException:
        if lead:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    _sync(f"mtpspec save_params {path} written")
    if lead:
        shutil.rmtree(old, ignore_errors=True)
        if os.path.exists(path):
            os.rename(path, old)
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def restore_params(
    path: str | os.PathLike, *, mesh=None, dtype: str | None = None
) -> tuple[ModelConfig, dict]:
    """Read back what ``save_params`` wrote: (config, params). With ``mesh`` (a (data, model)
    Mesh), every leaf is restored straight into its ``mtpspec.sharding`` layout (orbax reads
    each device's shard; nothing is gathered on one device). ``dtype`` (one of
    ``config.DTYPES``; None: as saved) casts every floating-point leaf as it is read, and the
    returned config carries it; anything else is a ValueError before any read."""
    dtype = None if dtype is None else check_dtype(dtype)
    path = os.path.abspath(os.fspath(path))
    cfg_file = os.path.join(path, CONFIG_FILE)
    params_dir = os.path.join(path, PARAMS_DIR)
    if not os.path.isfile(cfg_file):
        raise OSError(f"no saved config at {cfg_file}")
    if not os.path.isdir(params_dir):
        raise OSError(f"no saved params at {params_dir}")
    with open(cfg_file) as f:
        try:
            config = _config_from_dict(json.load(f))
        except json.JSONDecodeError as e:
            raise ValueError(f"saved config {cfg_file} is not valid JSON: {e}") from e
    if dtype is not None:
        config = dataclasses.replace(config, dtype=dtype)
    with _checkpointer() as ckptr:
        meta = _metadata_tree(ckptr, params_dir)
        if mesh is None:
            one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            shardings = jax.tree.map(lambda _: one, meta)
        else:
            shardings = mtp_sharding.param_shardings(config, mesh)
            if jax.tree.structure(shardings) != jax.tree.structure(meta):
                raise ValueError(f"saved params at {params_dir} do not match the saved config")

        def leaf(m, sh):
            cast = dtype is not None and jnp.issubdtype(m.dtype, jnp.floating)
            return jax.ShapeDtypeStruct(tuple(m.shape), dtype if cast else m.dtype, sharding=sh)

        target = jax.tree.map(leaf, meta, shardings)
        try:
            params = ckptr.restore(params_dir, target)
        except (ValueError, TypeError):
            raise
        except Exception as e:  # noqa: BLE001 - orbax / tensorstore errors on torn data
            raise OSError(f"cannot read the saved params at {params_dir}: {e}") from e
    check_param_tree(config, params)
    return config, params


def _metadata_tree(ckptr, params_dir: str):
    """The saved params' metadata tree; OSError when it is missing or unreadable."""
    try:
        item = ckptr.metadata(params_dir).item_metadata
    except Exception as e:  # noqa: BLE001 - orbax raises many kinds on torn metadata
        raise OSError(f"cannot read the saved params' metadata at {params_dir}: {e}") from e
    tree = getattr(item, "tree", None)
    if tree is None:
        raise OSError(
            f"the saved params at {params_dir} have no readable metadata (an incomplete or "
            "corrupt checkpoint)"
        )
    return tree
