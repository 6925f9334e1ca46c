// The fault guide's table: one entry per BUGS.md pattern, in catalog order (core/fault_guide.h). Over 200
// lines because it is data: 22 patterns with a symptom, a fix and a before/after snippet each.
#include <vector>

#include "core/fault_guide.h"

namespace ddpcheck::core {

namespace {

const std::vector<FaultGuide>& Guides() {
  static const std::vector<FaultGuide> guides = {
      {"skip-set-epoch",
       "every epoch sees the batches in the same order; the loss curve repeats itself epoch after epoch",
       "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader",
       "for epoch in range(epochs):\n    for x, y in loader:\n        train_step(x, y)",
       "for epoch in range(epochs):\n    sampler.set_epoch(epoch)\n    for x, y in loader:\n        train_step(x, y)"},
      {"sampler-seed-per-rank",
       "ranks train on overlapping shards (some samples twice per epoch, some never); accuracy lags a single GPU",
       "give DistributedSampler the same seed on every rank (the default seed=0); never derive it from the rank",
       "sampler = DistributedSampler(ds, seed=base_seed + rank)",
       "sampler = DistributedSampler(ds, seed=base_seed)  # same on every rank"},
      {"eval-padding-counted",
       "evaluation metrics differ with the world size: DistributedSampler repeats samples to pad the last shard",
       "evaluate without padding: drop the padded duplicates (or gather exactly len(dataset) predictions)",
       "sampler = DistributedSampler(val_ds, shuffle=False)\ncorrect = all_reduce(sum(pred == y for ...))\n"
       "acc = correct / (len(sampler) * world)",
       "sampler = DistributedSampler(val_ds, shuffle=False)\n# keep only the first len(val_ds) gathered predictions\n"
       "acc = correct_without_padding / len(val_ds)"},
      {"no-buffer-broadcast",
       "BatchNorm running_mean / running_var differ between ranks; evaluation depends on which rank saves",
       "keep broadcast_buffers=True (the default), or use SyncBatchNorm",
       "model = DDP(model, device_ids=[rank], broadcast_buffers=False)",
       "model = DDP(model, device_ids=[rank])  # broadcast_buffers=True"},
      {"buffer-outside-ddp",
       "one rank starts from different buffers (running stats, masks) before the first step",
       "put every module with state inside the module wrapped by DDP, so its buffers are broadcast from rank 0",
       "norm = nn.BatchNorm1d(32)          # outside the DDP module\nmodel = DDP(net)\nout = norm(model(x))",
       "net = nn.Sequential(net, nn.BatchNorm1d(32))\nmodel = DDP(net)\nout = model(x)"},
      {"no-initial-broadcast",
       "ranks hold different parameters from the first step on; the run never agrees with a single process",
       "wrap the model in DDP (it broadcasts rank 0's parameters at construction) and load or change its weights "
       "(a checkpoint, pretrained embeddings) before wrapping it or on every rank alike, or seed every rank alike",
       "torch.manual_seed(rank)\nmodel = Net()\n# a hand-written all-reduce of gradients, no DDP",
       "torch.manual_seed(seed)\nmodel = DDP(Net(), device_ids=[rank])  # broadcasts rank 0's state"},
      {"bypass-ddp",
       "one rank's gradients are never averaged (or the others hang waiting for its all-reduce)",
       "call the DDP wrapper itself (model(x)); route other methods through forward()",
       "out = model.module.encode(x)   # skips DDP's forward: the reducer is never armed\nloss.backward()",
       "out = model(x, mode='encode')  # forward() dispatches to encode\nloss.backward()"},
      {"unused-param",
       "\"Expected to have finished reduction in the prior iteration\" one step later, or a hang",
       "make every parameter take part in the loss, or pass find_unused_parameters=True",
       "model = DDP(net)                # net.head2 is unused in some steps",
       "model = DDP(net, find_unused_parameters=True)"},
      {"nosync-unused",
       "after a no_sync accumulation window, a parameter used only in an early micro-step is not averaged",
       "use the parameter in every micro-step of the window, or upgrade PyTorch (fixed in 2.4, PR #124193)",
       "with model.no_sync():\n    model(x0, use_aux=True).backward()\nmodel(x1, use_aux=False).backward()",
       "with model.no_sync():\n    model(x0, use_aux=True).backward()\nmodel(x1, use_aux=True).backward()"},
      {"different-forward-path",
       "a hang or a collective mismatch at the first step where one rank takes another branch",
       "make control flow identical on every rank (decide with an all-reduced value, not a rank-local one)",
       "if loss.item() > thresh:           # rank-local decision\n    out = model(x, extra=True)",
       "flag = torch.tensor(float(loss.item() > thresh))\ndist.all_reduce(flag, op=dist.ReduceOp.MAX)\n"
       "if flag.item() > 0:\n    out = model(x, extra=True)"},
      {"scaler-state",
       "one rank skips steps the others take (its loss scale differs); parameters drift apart",
       "restore the GradScaler from the same checkpoint on every rank (scaler.load_state_dict) and never update it "
       "before the all-reduce",
       "if rank == 0:\n    scaler.load_state_dict(ckpt['scaler'])",
       "scaler.load_state_dict(ckpt['scaler'])   # on every rank"},
      {"clip-before-unscale",
       "training with AMP is much slower to converge than fp32: gradients are clipped `scale` times too hard",
       "call scaler.unscale_(optimizer) before clip_grad_norm_",
       "scaler.scale(loss).backward()\nclip_grad_norm_(model.parameters(), 1.0)\nscaler.step(optimizer)",
       "scaler.scale(loss).backward()\nscaler.unscale_(optimizer)\nclip_grad_norm_(model.parameters(), 1.0)\n"
       "scaler.step(optimizer)"},
      {"skip-step",
       "parameters differ between ranks after a step one rank skipped (or the others hang)",
       "make skip decisions collectively: all-reduce the condition so every rank skips together",
       "if not torch.isfinite(loss):      # rank-local\n    continue",
       "bad = torch.tensor(float(not torch.isfinite(loss)))\ndist.all_reduce(bad)\nif bad.item() > 0:\n    continue"},
      {"uneven-batches",
       "the job hangs at the end of an epoch (ranks with more batches wait for one that left the loop)",
       "give every rank the same number of batches (DistributedSampler, drop_last) or wrap the loop in "
       "model.join()",
       "for x, y in rank_local_loader:     # lengths differ per rank\n    train_step(x, y)",
       "with model.join():\n    for x, y in rank_local_loader:\n        train_step(x, y)"},
      {"param-order",
       "\"DDP expects same model across all ranks\" at construction, or gradients averaged into the wrong tensors",
       "register parameters in a deterministic order (lists or ordered dicts, never sets)",
       "self.layers = nn.ModuleList(build(n) for n in set(names))",
       "self.layers = nn.ModuleList(build(n) for n in sorted(names))"},
      {"loss-times-world",
       "gradients (and the effective learning rate) are W times too large; training diverges as W grows",
       "keep the loss a mean over the local batch: DDP already averages gradients over ranks",
       "loss = criterion(out, y) * world_size\nloss.backward()",
       "loss = criterion(out, y)\nloss.backward()"},
      {"grad-accum-normalisation",
       "gradients are off by the accumulation factor (or the last partial window is weighted wrongly)",
       "divide each micro-batch loss by the number of micro-batches actually in the window, once",
       "for i, (x, y) in enumerate(loader):\n    (criterion(model(x), y) / accum / world_size).backward()",
       "for i, (x, y) in enumerate(loader):\n    n = micro_batches_in_this_window(i)\n"
       "    (criterion(model(x), y) / n).backward()"},
      {"lr-not-scaled",
       "changing the number of GPUs changes convergence: the global batch grew but the learning rate did not",
       "scale the learning rate with the global batch (linear rule: lr = base_lr * W * batch / base_batch)",
       "optimizer = SGD(model.parameters(), lr=base_lr)",
       "optimizer = SGD(model.parameters(), lr=base_lr * world_size * batch / base_batch)"},
      {"same-dropout-seed",
       "every rank drops the same units: the ranks' gradients are correlated and W GPUs act like fewer",
       "seed each rank's RNG differently for dropout (model init still comes from rank 0's broadcast)",
       "torch.manual_seed(seed)            # same on every rank, also for dropout",
       "torch.manual_seed(seed + rank)     # DDP broadcasts rank 0's initial parameters anyway"},
      {"drop-bucket",
       "a hang, or \"collective ... does not match on every rank\", at the step where one rank skipped an all-reduce",
       "never skip or reorder collectives on one rank; let DDP's reducer launch every bucket",
       "if rank != 0:\n    dist.all_reduce(grad_bucket)    # a hand-rolled reduction one rank skips",
       "dist.all_reduce(grad_bucket)        # every rank, same order"},
      {"uneven-shard-mean",
       "the last step of an epoch weights samples unequally: DDP averages per-rank means of different sizes",
       "use drop_last=True (or equal shards) when the exact global mean matters; otherwise this is DDP's documented "
       "behaviour",
       "loader = DataLoader(ds, batch_size=b, sampler=DistributedSampler(ds))",
       "loader = DataLoader(ds, batch_size=b, sampler=DistributedSampler(ds), drop_last=True)"},
      {"syncbn-unequal-counts",
       "SyncBatchNorm running_var differs from a single process when ranks hold batches of different sizes",
       "merge per-rank statistics weighted by their counts (PyTorch's SyncBatchNorm does since PR #36688)",
       "mean = all_reduce(local_mean) / world\nvar = all_reduce(local_var) / world",
       "n = all_reduce(local_count)\nmean = all_reduce(local_mean * local_count) / n\n"
       "var = all_reduce((local_var + (local_mean - mean) ** 2) * local_count) / n"},
  };
  return guides;
}

const std::vector<FaultGuide>& RecordedGuides() {
  static const std::vector<FaultGuide> guides = {
      {"loss-scale-per-rank",
       "one rank's gradients are a constant multiple of the others' before the all-reduce: the averaged gradient "
       "leans towards that rank's shard, and the run differs from a single process",
       "scale the loss the same way on every rank (the same reduction, the same divisor, the same GradScaler "
       "settings); never by a rank-dependent number such as that rank's local batch size",
       "loss = loss_fn(out, y) * (len(y) / global_batch)  # len(y) differs on the last, shorter shard\n"
       "loss.backward()",
       "loss = loss_fn(out, y)  # the same scale on every rank; DDP averages over ranks\nloss.backward()"},
      {"dataset-per-rank",
       "a dataset row (an input or its target) holds other values on one rank than on another: each rank trains on "
       "other data, so the averaged gradient is no single process's",
       "build the data the same on every rank: load a teacher or a preprocessing state on every rank (or load it on "
       "rank 0 and broadcast it) before computing targets, and give a per-rank random state only to augmentation",
       "teacher = Net()\nif rank == 0:\n    teacher.load_state_dict(torch.load(\"teacher.pt\"))\ntargets = teacher(x)",
       "teacher = Net()\nteacher.load_state_dict(torch.load(\"teacher.pt\"))  # on every rank\ntargets = teacher(x)"},
      {"loss-per-rank",
       "the loss is built with other settings on one rank than on another (a pos_weight or class weights counted on "
       "the rank's own shard, a distillation alpha or temperature, label smoothing set per rank): each rank "
       "minimises another loss, so the averaged gradient is no single process's",
       "compute pos_weight (or class weights) from the whole dataset, or all_reduce the counts before building the "
       "loss; set alpha, temperature and label smoothing from values that do not depend on the rank",
       "pos = y_shard.sum()  # this rank's shard only\n"
       "loss_fn = nn.BCEWithLogitsLoss(pos_weight=(len(y_shard) - pos) / pos)",
       "counts = torch.stack([y_shard.sum(), torch.tensor(len(y_shard))]).float()\n"
       "dist.all_reduce(counts)  # the whole dataset's counts, on every rank\n"
       "loss_fn = nn.BCEWithLogitsLoss(pos_weight=(counts[1] - counts[0]) / counts[0])"},
      {"attribute-per-rank",
       "a submodule holds a tensor (a graph's edge_index, a mask, a lookup table) or a setting as a plain attribute "
       "that differs between ranks (built from a per-rank seed or the rank's own data): DDP broadcasts parameters "
       "and buffers, never plain attributes, so each rank's forward runs another model and the averaged gradient "
       "is no single process's",
       "register it as a buffer (register_buffer) so DDP broadcasts it, or build it from the same seed on every rank",
       "graph = make_graph(seed=rank)\nself.edge_index = graph.edge_index  # a plain attribute: never broadcast",
       "graph = make_graph(seed=rank)\nself.register_buffer(\"edge_index\", graph.edge_index)  # DDP broadcasts rank "
       "0's"},
      {"param-outside-ddp",
       "the optimizer steps a parameter that DDP's module does not hold (a learnable loss weight, an "
       "uncertainty-weighting module beside the model): DDP all-reduces only the gradients of the module it wraps, "
       "so each rank steps that parameter with its own gradient and the ranks' copies part at the first step",
       "put the module inside the one DDP wraps (an nn.Module holding both the model and the loss weights), or "
       "all_reduce those gradients yourself (divided by the world size) before optimizer.step()",
       "awl = AutomaticWeightedLoss(2)\nddp = DDP(model)\nopt = AdamW([*ddp.parameters(), *awl.parameters()])",
       "class Both(nn.Module):  # model and loss weights in one module\n    ...\nddp = DDP(Both(model, "
       "AutomaticWeightedLoss(2)))\nopt = AdamW(ddp.parameters())"},
      {"optimizer-settings-per-rank",
       "a param group's hyper-parameters (weight_decay, momentum, betas, eps, or the lr with every lr scheduler "
       "stepped alike) differ between ranks at a step: each rank updates its parameters differently, so they part "
       "although DDP averages the gradients",
       "build the optimizer with the same settings on every rank, and change them (if at all) on every rank alike",
       "wd = 0.05 if rank == 0 else 0.1\nopt = AdamW(ddp.parameters(), weight_decay=wd)",
       "opt = AdamW(ddp.parameters(), weight_decay=0.05)  # one setting for every rank"},
      {"scheduler-one-rank",
       "the learning rate differs between ranks from some step on: parameters drift apart although the gradients "
       "are averaged",
       "step every LR scheduler on every rank, the same number of times (after optimizer.step())",
       "optimizer.step()\nif rank == 0:\n    scheduler.step()",
       "optimizer.step()\nscheduler.step()  # on every rank"},
  };
  return guides;
}

}  // namespace

const FaultGuide* FindFaultGuide(const std::string& name) {
  // A diagnosis names the rank (and step) it found the pattern on: "scheduler-one-rank@1", "skip-step@1:2" (QA
  // round 16: such a diagnosis had no "how to fix" line).
  const std::string base = name.substr(0, name.find_first_of("@:"));
  for (const auto* table : {&Guides(), &RecordedGuides()}) {
    for (const auto& g : *table) {
      if (base == g.name) return &g;
    }
  }
  return nullptr;
}

const std::vector<RecordedPattern>& RecordedPatterns() {
  static const std::vector<RecordedPattern> patterns = {
      {"loss-scale-per-rank", "reference-divergent", "local grads, the step it starts",
       "one rank scales its loss (so its local gradients) by a different factor than the others; the protocol "
       "check's least-squares scale of that rank's local gradient against its float64 single-process gradient is "
       "off while the other ranks' is 1"},
      {"dataset-per-rank", "rank-divergent", "sampler (dataset rows), the first step a rank drew a differing row",
       "a dataset row recorded by two ranks holds different values while each rank drew its rows the same every "
       "time (no augmentation or sampling per draw): a teacher or a preprocessing state loaded on one rank only, or "
       "a dataset file that differs per rank"},
      {"loss-per-rank", "rank-divergent", "loss (the loss's settings), the first step they differ",
       "what parameterises the loss (the recorder's loss_state: a loss module's plain settings, buffers, parameters "
       "and tensor attributes such as pos_weight or weight; a loss function's closure variables, defaults, globals "
       "and functools.partial arguments) differs between ranks at a step: a pos_weight or class weights computed "
       "from the rank's own shard, an alpha set per rank"},
      {"attribute-per-rank", "rank-divergent", "forward_buffers (model.<attribute>), the first step they differ",
       "a tensor a submodule holds as a plain attribute (in vars(m): not a parameter or buffer) or a submodule's "
       "plain settings differ between ranks at a step, while each rank holds it the same at every step (the "
       "recorder's model_state): a graph or mask built from a per-rank seed"},
      {"param-outside-ddp", "rank-divergent", "params (optimizer.group<g>[<i>]), the first step",
       "a parameter the optimizer steps that DDP's module does not hold differs between ranks after a step (the "
       "recorder's outside_params, its value or checksum after optimizer.step()): a learnable loss weight beside "
       "the model"},
      {"optimizer-settings-per-rank", "rank-divergent", "lr (optimizer.<setting> (group <g>)), the first step",
       "a param group's hyper-parameter (weight_decay, momentum, betas, eps, as the recorder's groups give them at "
       "the optimizer step, or the lr where every lr scheduler stepped as often on every rank: an lr scaled or set "
       "by hand on one rank, or a scheduler fed a per-rank value such as ReduceLROnPlateau's metric) differs "
       "between ranks at a step"},
      {"scheduler-one-rank", "rank-divergent", "lr, the first step after the scheduler diverged",
       "an LR scheduler stepped a different number of times on one rank (stepped on rank 0 only, or skipped on "
       "one rank): the lr at the optimizer step differs between ranks"},
  };
  return patterns;
}

}  // namespace ddpcheck::core
