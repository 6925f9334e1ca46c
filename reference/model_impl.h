// Definitions of Model<T>'s templated members; include reference/model.h, not this file.
#pragma once

#include <fmt/format.h>

#include "reference/model.h"

namespace ddpcheck::ref {

template <class T>
core::Status Model<T>::Build(const std::vector<core::LayerSpec>& layers, const std::string& loss, Model* out,
                             bool init) {
  Model m;
  DDPCHECK_RETURN_IF_ERROR(ValidateModelSpec(layers, loss, &m.widths_));
  m.specs_ = layers;
  m.loss_ = loss;
  for (const core::LayerSpec& spec : layers) m.layers_.push_back(MakeLayer(spec));
  m.Register();
  m.SetRank(0);
  m.SetTraining(true);
  if (init) m.InitFromSeed(0, false);
  *out = std::move(m);
  return core::Status::Ok();
}

template <class T>
typename Model<T>::Layer Model<T>::MakeLayer(const core::LayerSpec& spec) {
  if (spec.type == "linear") return Linear<T>(spec.in_features, spec.out_features, spec.bias);
  if (spec.type == "relu") return ReLU<T>();
  if (spec.type == "tanh") return Tanh<T>();
  if (spec.type == "dropout") return Dropout<T>(spec.p);
  BatchNormOptions o;
  o.eps = spec.eps;
  o.momentum = spec.momentum;
  o.momentum_none = spec.momentum_none;
  o.affine = spec.affine;
  o.track_running_stats = spec.track_running_stats;
  if (spec.type == "syncbatchnorm1d") return SyncBatchNorm1d<T>(spec.num_features, o);
  DDPCHECK_CHECK_EQ(spec.type, std::string("batchnorm1d"));
  return BatchNorm1d<T>(spec.num_features, o);
}

template <class T>
void Model<T>::Register() {
  for (size_t li = 0; li < layers_.size(); ++li) {
    const int layer = static_cast<int>(li);
    param_base_.push_back(static_cast<int>(param_slots_.size()));
    std::visit(
        [&](auto& l) {
          for (int s = 0; s < l.num_params(); ++s) {
            param_slots_.push_back({layer, s});
            param_infos_.push_back({fmt::format("{}.{}", li, l.param_name(s)), l.param(s)->shape, core::DTypeOf<T>()});
          }
          for (int s = 0; s < l.num_buffers(); ++s) {
            const Buffer<T>* b = l.buffer(s);
            buffer_slots_.push_back({layer, s});
            buffer_infos_.push_back({fmt::format("{}.{}", li, l.buffer_name(s)), b->shape, b->dtype});
          }
        },
        layers_[li]);
  }
}

template <class T>
void Model<T>::SetTraining(bool training) {
  training_ = training;
  for (Layer& l : layers_) std::visit([&](auto& x) { x.SetTraining(training); }, l);
}

template <class T>
void Model<T>::SetRank(int rank) {
  rank_ = rank;
  SetMicroStep(0);
}

template <class T>
void Model<T>::SetMicroStep(int64_t micro_step) {
  micro_step_ = micro_step;
  bypassed_.assign(specs_.size(), false);
  for (size_t i = 0; i < specs_.size(); ++i) {
    bypassed_[i] = LayerBypassedOnRank(specs_[i], rank_) ||
                   (specs_[i].only_micro_step >= 0 && specs_[i].only_micro_step != micro_step_);
  }
}

template <class T>
void Model<T>::SetAutocast(std::optional<core::DType> low, bool range_only) {
  DDPCHECK_CHECK(!low || *low == core::DType::kFloat16 || *low == core::DType::kBFloat16, "autocast dtype ",
                 core::DTypeName(*low));
  autocast_ = low;
  autocast_range_only_ = range_only;
  for (Layer& l : layers_) {
    if (auto* lin = std::get_if<Linear<T>>(&l)) lin->SetAutocast(low, range_only);
  }
}

template <class T>
void Model<T>::RoundToAutocast(Matrix<T>* m) const {
  if (autocast_) CastInPlace(m, LowCast{*autocast_, autocast_range_only_});
}

template <class T>
void Model<T>::InitFromSeed(uint64_t seed, bool exact) {
  std::mt19937_64 rng(seed);
  for (Layer& layer : layers_) {
    if (auto* lin = std::get_if<Linear<T>>(&layer)) {
      const double bound = 1.0 / std::sqrt(static_cast<double>(lin->in_features()));
      for (int s = 0; s < lin->num_params(); ++s) {
        for (T& v : lin->param(s)->value) {
          v = exact ? static_cast<T>(static_cast<int>(rng() % 17) - 8) / T(16)
                    : static_cast<T>((2.0 * PortableUniform(rng) - 1.0) * bound);
        }
      }
    } else if (auto* bn = std::get_if<BatchNorm1d<T>>(&layer)) {
      bn->ResetParameters();
    } else if (auto* sbn = std::get_if<SyncBatchNorm1d<T>>(&layer)) {
      sbn->ResetParameters();
    }
  }
}

template <class T>
core::Status Model<T>::LoadValues(const std::map<std::string, core::Tensor>& values) {
  std::map<std::string, const core::Tensor*> refs;
  for (const auto& [name, t] : values) refs[name] = &t;
  return LoadValues(refs);
}

template <class T>
core::Status Model<T>::LoadValues(const std::map<std::string, const core::Tensor*>& values) {
  std::string known;
  for (const auto& info : param_infos_) known += (known.empty() ? "" : ", ") + info.name;
  for (const auto& info : buffer_infos_) known += (known.empty() ? "" : ", ") + info.name;
  for (const auto& [name, tp] : values) {
    const core::Tensor& t = *tp;
    const int p = param_index(name), b = buffer_index(name);
    if (p < 0 && b < 0) {
      return core::Status::NotFound(
          fmt::format("LoadValues: the model has no parameter or buffer \"{}\"; it has {}", name, known));
    }
    const core::ParamInfo& info = p >= 0 ? param_info(p) : buffer_info(b);
    if (t.shape != info.shape || t.numel() != info.numel()) {
      return core::Status::Invalid(fmt::format("LoadValues: {}: shape {} ({} values) does not match the model's {}",
                                               name, core::ShapeString(t.shape), t.numel(),
                                               core::ShapeString(info.shape)));
    }
  }
  for (const auto& [name, t] : values) {
    const int p = param_index(name);
    T* dst = p >= 0 ? param_data(p) : buffer_data(buffer_index(name));
    for (size_t k = 0; k < t->data.size(); ++k) dst[k] = static_cast<T>(t->data[k]);
  }
  return core::Status::Ok();
}

template <class T>
core::Status Model<T>::CheckInputs(const Matrix<T>& x, const core::Tensor& y) const {
  const int64_t batch = x.rows();
  if (batch < 1) return core::Status::Invalid("model input: the batch is empty");
  if (widths_.in >= 0 && x.cols() != widths_.in) {
    return core::Status::Invalid(
        fmt::format("model input: x has {} features, the model takes {}", x.cols(), widths_.in));
  }
  const int64_t out = widths_.out >= 0 ? widths_.out : x.cols();
  if (loss_ == "mse") {
    if (y.shape != std::vector<int64_t>{batch, out}) {
      return core::Status::Invalid(fmt::format("model input: mse targets have shape {}, want {}",
                                               core::ShapeString(y.shape), core::ShapeString({batch, out})));
    }
  } else {
    if (y.shape != std::vector<int64_t>{batch}) {
      return core::Status::Invalid(fmt::format("model input: cross_entropy targets have shape {}, want {}",
                                               core::ShapeString(y.shape), core::ShapeString({batch})));
    }
    for (double c : y.data) {
      if (!(c >= 0 && c < static_cast<double>(out) && c == std::floor(c))) {
        return core::Status::Invalid(fmt::format("model input: class id {} is not an integer in [0, {})", c, out));
      }
    }
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (bypassed_[i] || batch >= 2) continue;
    const auto* bn = std::get_if<BatchNorm1d<T>>(&layers_[i]);
    const auto* sbn = std::get_if<SyncBatchNorm1d<T>>(&layers_[i]);
    // A syncing SyncBatchNorm takes statistics over every rank's rows: one row here is enough (torch raises
    // only for a single value with world < 2).
    const bool local_stats = (bn != nullptr && bn->UsesBatchStats()) ||
                             (sbn != nullptr && sbn->UsesBatchStats() && !sbn->Syncs(sync_group_));
    if (local_stats) {
      return core::Status::Invalid(fmt::format(
          "model input: layer {} ({}) needs more than 1 value per channel with batch statistics, got a batch of {}",
          i, specs_[i].type, batch));
    }
  }
  return core::Status::Ok();
}

template <class T>
T Model<T>::Forward(const Matrix<T>& x, const core::Tensor& y) {
  T loss = 0;
  const core::Status st = Forward(x, y, &loss);
  DDPCHECK_CHECK(st.ok(), st.ToString());
  return loss;
}

template <class T>
core::Status Model<T>::Forward(const Matrix<T>& x, const core::Tensor& y, T* loss) {
  const core::Status st = CheckInputs(x, y);
  DDPCHECK_CHECK(st.ok(), st.ToString());
  has_forward_ = false;
  inputs_.resize(layers_.size());
  input_low_.assign(layers_.size(), false);
  bool low = false;  // h holds autocast-dtype values
  Matrix<T> h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    inputs_[i] = h;
    input_low_[i] = low;
    if (bypassed_[i]) continue;
    if (auto* sbn = std::get_if<SyncBatchNorm1d<T>>(&layers_[i])) {
      DDPCHECK_RETURN_IF_ERROR(sbn->Forward(inputs_[i], sync_group_, static_cast<int>(i), &h));
    } else {
      h = std::visit(
          [&](auto& l) -> Matrix<T> {
            using L = std::decay_t<decltype(l)>;
            if constexpr (std::is_same_v<L, Dropout<T>>) {
              return l.Forward(inputs_[i], &dropout_rng_);
            } else if constexpr (std::is_same_v<L, SyncBatchNorm1d<T>>) {
              DDPCHECK_CHECK(false, "unreachable");
              return {};
            } else {
              return l.Forward(inputs_[i]);
            }
          },
          layers_[i]);
    }
    if (!autocast_) continue;
    if (std::holds_alternative<Linear<T>>(layers_[i])) {
      low = true;
    } else if (low) {
      RoundToAutocast(&h);
      // (|tanh| <= 1 never overflows: a range-only cast leaves the saved output as it is)
      auto* t = std::get_if<Tanh<T>>(&layers_[i]);
      if (t && !autocast_range_only_) t->RoundSavedOutput(*autocast_);
    }
  }
  output_low_ = low;
  output_ = h;
  has_forward_ = true;
  if (loss_ == "mse") {
    Matrix<T> target(h.rows(), h.cols());
    for (Eigen::Index k = 0; k < target.size(); ++k) target.data()[k] = static_cast<T>(y.data[static_cast<size_t>(k)]);
    *loss = mse_.Forward(h, target);
    return core::Status::Ok();
  }
  std::vector<int64_t> ids(y.data.size());
  for (size_t k = 0; k < ids.size(); ++k) ids[k] = static_cast<int64_t>(y.data[k]);
  *loss = cross_entropy_.Forward(h, ids);
  return core::Status::Ok();
}

template <class T>
core::Status Model<T>::Backward(T loss_scale, const core::GradReadyFn& on_ready) {
  DDPCHECK_CHECK(has_forward_, "Model::Backward before any Forward");
  Matrix<T> d = loss_ == "mse" ? mse_.Backward(loss_scale) : cross_entropy_.Backward(loss_scale);
  if (output_low_) RoundToAutocast(&d);  // the backward of the loss's cast to float32
  // Without an input gradient to give, backward ends at the lowest running layer with parameters (autograd
  // stops where nothing requires grad), and a Linear there skips its dx product.
  layer_input_grads_.assign(keep_layer_input_grads_ ? layers_.size() : 0, Matrix<T>());
  size_t lowest = layers_.size();
  for (size_t j = 0; j < layers_.size() && !input_grad_needed_; ++j) {
    if (!bypassed_[j] && std::visit([](const auto& l) { return l.num_params() > 0; }, layers_[j])) {
      lowest = j;
      break;
    }
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    if (!input_grad_needed_ && i < lowest) break;
    if (bypassed_[i]) continue;
    const int base = param_base_[i];
    SlotReadyFn ready;
    if (on_ready) ready = [&](int slot) { on_ready(base + slot); };
    if (auto* sbn = std::get_if<SyncBatchNorm1d<T>>(&layers_[i])) {
      // torch all-reduces SyncBatchNorm's gradient sums only when its input requires grad: when an earlier
      // layer that runs has parameters.
      bool needs_input_grad = false;
      for (size_t j = 0; j < i; ++j) {
        if (!bypassed_[j]) needs_input_grad |= std::visit([](const auto& l) { return l.num_params() > 0; }, layers_[j]);
      }
      Matrix<T> dx;
      DDPCHECK_RETURN_IF_ERROR(sbn->Backward(d, ready, sync_group_, static_cast<int>(i), needs_input_grad, &dx));
      d = std::move(dx);
    } else {
      d = std::visit(
          [&](auto& l) -> Matrix<T> {
            if constexpr (std::is_same_v<std::decay_t<decltype(l)>, SyncBatchNorm1d<T>>) {
              DDPCHECK_CHECK(false, "unreachable");
              return {};
            } else if constexpr (std::is_same_v<std::decay_t<decltype(l)>, Linear<T>>) {
              return l.Backward(d, ready, /*need_dx=*/input_grad_needed_ || i != lowest);
            } else {
              return l.Backward(d, ready);
            }
          },
          layers_[i]);
    }
    if (input_low_[i] && !std::holds_alternative<Linear<T>>(layers_[i])) RoundToAutocast(&d);
    if (keep_layer_input_grads_) layer_input_grads_[i] = d;
  }
  input_grad_ = input_grad_needed_ ? std::move(d) : Matrix<T>();
  return core::Status::Ok();
}

template <class T>
void Model<T>::ZeroGrad(bool set_to_none) {
  for (int i = 0; i < num_params(); ++i) {
    Param<T>& p = ParamAt(i);
    if (set_to_none) {
      // None: nothing reads an undefined grad's storage (the next gradient is written over it), so it is not
      // zeroed; a model's size of memory is not written for nothing.
      p.grad_defined = false;
      p.grad_zeroed = false;
      p.zero_pending.store(false);  // an undefined grad's storage is written over, never read
      continue;
    }
    if (!p.grad_defined) continue;
    p.ZeroLazily();  // the zeros are written by the first reader, or a weight gradient written over them
  }
}

}  // namespace ddpcheck::ref
