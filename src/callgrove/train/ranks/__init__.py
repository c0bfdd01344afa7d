"""The learner as N ranks of torch.distributed: FSDP2 (`fully_shard`) shards the model across
processes the learner starts itself, each step's rows are dealt among them, and the update is
the one process's.

`RankedLearner` satisfies `callgrove.models.Learner`. The process that holds it (the driver:
the loop, its sampler) keeps no model, only a pipe to each rank; the ranks hold the shards, the
optimizer's shards, and run the steps. One module per job:
- `driver`: `RankedLearner`, which starts the ranks, sends them each command and watches them
  (`RankFailed` when one dies or fails alone), and `ranked_or_local`, the one place that
  decides between it and the learner in this process;
- `rank`: a rank's process: its process group, its learner over the shards, the commands it
  serves;
- `shipping`: what crosses the pipes, and how whole tensors travel: gathered into shared
  memory on the way out, sharded as the model is on the way in;
- `fsdp`: the FSDP2 units a model is sharded into;
- the dealing of a step's rows among the ranks is the batch stage's
  (`callgrove.batch.packing.deal`, re-exported here).

Exact across world sizes (`world_size = 1`, the learner in one process, is the reference):
- the driver deals the step's rows whole, in the units tree packing needs together, each rank
  taking the next heaviest unit while it is the lightest (`deal`); each rank packs its share as
  the one-process learner packs a step;
- every micro-batch's loss is divided by the denominator of the whole step (`step_denominator`
  over all its rows), and the gradient shards are reduced by sum, not FSDP's mean (`fsdp`), so
  every parameter's gradient is the one-process sum over the same rows;
- every rank runs as many forward and backward passes as the busiest (`rank`);
- gradient clipping uses the whole gradient's norm, and the loss is summed across ranks before
  the finite check, so all ranks step or all refuse (`rank`);
- the metrics are every rank's: the driver reports them over all ranks as one process would
  (`driver`).
"""

from callgrove.batch.packing import deal
from callgrove.train.ranks.driver import PRELOAD, RankedLearner, RankFailed, ranked_or_local

__all__ = ["PRELOAD", "RankFailed", "RankedLearner", "deal", "ranked_or_local"]
