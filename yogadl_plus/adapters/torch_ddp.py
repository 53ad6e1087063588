"""What the torch faces refuse in a DDP job: shards that hand out different numbers of items
(a rank with a step more than the others would wait for ever in its last collective)."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["distributed", "refuse_filtered_shards", "refuse_uneven_shards"]


def refuse_uneven_shards(
    what: str, counts: Callable[[int], list[int]], first_epoch: int, allow: bool
) -> None:
    """ValueError in a DDP job whose shards hand out different numbers of items (``counts``
    of an epoch: per rank) in its first epoch, which may be begun part-way, or in the next."""
    if allow or not distributed():
        return
    for epoch in (first_epoch, first_epoch + 1):
        per_rank = counts(epoch)
        if len(set(per_rank)) > 1:
            shown = " / ".join(f"{count:,}" for count in per_rank[:8])
            shown += " / ..." if len(per_rank) > 8 else ""
            raise ValueError(
                f"{what}: the {len(per_rank)} shards of this stream hand out {shown} items in "
                f"epoch {epoch}; in a DDP job (torch.distributed is initialized) the ranks with "
                "fewer would leave the others waiting in their last collective for ever. Make "
                "the shards equal in the stream: drop_shard_remainder=True (leave the last "
                "positions of each epoch out) or pad_shard_remainder=True (repeat the first "
                "ones, as DistributedSampler does); or pass allow_uneven_shards=True if your "
                "loop copes with uneven inputs (torch.distributed.algorithms.Join)"
            )


def refuse_filtered_shards(allow: bool) -> None:
    """ValueError in a DDP job: a filtered stream's ranks hand out numbers of batches that
    depend on their records."""
    if allow or not distributed():
        return
    raise ValueError(
        "make_dataloader: with a predicate or skip=, the number of batches each rank hands out "
        "depends on how many of its records pass (its batches are filled, none empty); in a "
        "DDP job (torch.distributed is initialized) the ranks with fewer would leave the "
        "others waiting in their last collective for ever. Pass allow_uneven_shards=True and "
        "join the ranks' loops (torch.distributed.algorithms.Join), or leave the records out "
        "when caching (the version then has only those that pass)"
    )


def distributed() -> bool:
    """Whether this process is one of several in an initialized torch.distributed group."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
