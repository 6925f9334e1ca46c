#include "core/recorder.h"

namespace ddpcheck::core {

void StepRecorder::RecordParams(Checkpoint c) const {
  if (!trace_) return;
  const auto& infos = replica_->ParamInfos();
  for (size_t i = 0; i < infos.size(); ++i) {
    RecordSpan(c, infos[i].name, replica_->Param(static_cast<int>(i)), infos[i].shape);
  }
}

void StepRecorder::RecordGrads(Checkpoint c) const {
  if (!trace_) return;
  const auto& infos = replica_->ParamInfos();
  for (size_t i = 0; i < infos.size(); ++i) {
    if (!replica_->GradDefined(static_cast<int>(i))) continue;
    RecordSpan(c, infos[i].name, replica_->Grad(static_cast<int>(i)), infos[i].shape);
  }
}

void StepRecorder::RecordBuffers(Checkpoint c) const {
  if (!trace_) return;
  const auto& infos = replica_->BufferInfos();
  for (size_t i = 0; i < infos.size(); ++i) {
    Tensor t = replica_->Memory().ToHost(replica_->Buffer(static_cast<int>(i)), infos[i].shape);
    t.dtype = infos[i].dtype;
    Record(c, infos[i].name, std::move(t));
  }
}

}  // namespace ddpcheck::core
