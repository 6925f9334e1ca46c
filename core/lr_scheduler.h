// LR schedulers chained on one optimizer param group, as torch.optim.lr_scheduler (1.13; 2.x has the same
// formulas): StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR. SEMANTICS.md 6.3.
//
// Every scheduler uses torch's recursive (chainable) get_lr: it reads the group's *current* lr and writes
// the new one, so several schedulers on one group compose. Arithmetic is done in double in Python's order of
// operations (std::cos and M_PI-as-math.pi, std::pow for float ** int), so the lrs are bitwise torch's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// What torch's constructors reject, and the inputs torch would fail on at the first step (ZeroDivisionError):
// type is one of "step" "multistep" "exponential" "cosine" "linear"; step_size >= 1; t_max >= 1;
// LinearLR 0 < start_factor <= 1 (torch accepts 0, then divides by zero at epoch 1) and
// 0 <= end_factor <= 1 (torch's ValueError). Any total_iters is accepted, as in torch.
Status ValidateSchedulerSpec(const SchedulerSpec& spec);

// Parses the CLI spelling `TYPE[:key=value,...]` and validates it:
//   step:step_size=3[,gamma=0.1]          multistep:milestones=25|50|75[,gamma=0.1]
//   exponential:gamma=0.9                 cosine:t_max=50[,eta_min=0]
//   linear[:start_factor=0.333..,end_factor=1,total_iters=5]
// Keys torch requires (step_size, milestones, exponential's gamma, t_max; T_max is accepted too) must be
// given; the others default to torch's defaults. Numbers parse like Python's float()/int().
Status ParseSchedulerSpec(const std::string& text, SchedulerSpec* out);

class LrSchedule {
 public:
  // Constructs the schedulers in order on a fresh group with lr `lr` (last_epoch = -1): the first one sets
  // initial_lr = lr, which is base_lr for all of them, and each one does its initial step (epoch 0), which
  // only LinearLR changes (lr *= start_factor). Specs must pass ValidateSchedulerSpec (CHECKed).
  LrSchedule(double lr, const std::vector<SchedulerSpec>& specs);
  // Resuming: the group already has `initial_lr` and its current lr is `lr`; every scheduler is built with
  // last_epoch = `last_epoch` (>= 0), so its initial step is at last_epoch + 1 and CosineAnnealingLR takes its
  // closed form there (torch's `_step_count == 1 and last_epoch > 0` branch).
  LrSchedule(double lr, double initial_lr, int64_t last_epoch, const std::vector<SchedulerSpec>& specs);

  // The group's lr now: the lr the next optimizer step uses.
  double lr() const { return lr_; }
  // One epoch boundary: scheduler.step() for every scheduler, in spec order.
  void Step();
  // get_last_lr()[0] of each scheduler, in spec order: the lr right after that scheduler's last step (a later
  // scheduler in the chain may have changed the group's lr since).
  std::vector<double> last_lrs() const;
  // The epoch counter shared by the schedulers (0 after construction on a fresh group).
  int64_t last_epoch() const { return epoch_; }

 private:
  struct Sched {
    SchedulerSpec spec;
    int64_t step_count = 0;  // torch's _step_count
    double last_lr = 0.0;
  };
  void StepOne(Sched& s);

  double lr_ = 0.0;
  double base_lr_ = 0.0;  // group['initial_lr']
  int64_t epoch_ = -1;    // every scheduler's last_epoch (they are built and stepped together)
  std::vector<Sched> scheds_;
};

}  // namespace ddpcheck::core
