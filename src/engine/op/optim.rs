//! The optimizer updates, as ops: one launch per parameter with its gradient and state.
//! Hyperparameters are PyTorch's (`torch.optim.SGD`, `Adam`, `AdamW`), defaults included.

/// Which optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimKind {
    Sgd,
    SgdMomentum,
    Adam,
    AdamW,
    /// bitsandbytes' `Adam8bit` and `AdamW8bit` (block-wise 8-bit state).
    Adam8bit,
    AdamW8bit,
    /// bitsandbytes' `PagedAdamW8bit`: the large states in unified memory.
    PagedAdamW8bit,
    /// torchao's low-bit `Adam8bit` and `AdamW8bit` (`torchao.optim`, 0.18: block-wise
    /// quantized state subclasses, the update under `torch.compile`).
    TorchaoAdam8bit,
    TorchaoAdamW8bit,
    /// torchao's `Adam4bit` and `AdamW4bit` (4-bit codes packed two to a byte).
    TorchaoAdam4bit,
    TorchaoAdamW4bit,
}

/// How one of torchao's low-bit optimizers quantizes its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LowBit {
    /// Bits per code: 8 (one uint8 per element) or 4 (two per byte).
    pub bits: u8,
    /// Elements per float32 scale (the optimizer's `block_size` default).
    pub block: usize,
    /// Entries of each quantization map (float32).
    pub qmap: usize,
}

impl OptimKind {
    pub fn parse(name: &str) -> Option<OptimKind> {
        Some(match name {
            "sgd" => OptimKind::Sgd,
            "sgd_momentum" => OptimKind::SgdMomentum,
            "adam" => OptimKind::Adam,
            "adamw" => OptimKind::AdamW,
            "adam8bit" => OptimKind::Adam8bit,
            "adamw8bit" => OptimKind::AdamW8bit,
            "paged_adamw8bit" => OptimKind::PagedAdamW8bit,
            "torchao_adam8bit" => OptimKind::TorchaoAdam8bit,
            "torchao_adamw8bit" => OptimKind::TorchaoAdamW8bit,
            "torchao_adam4bit" => OptimKind::TorchaoAdam4bit,
            "torchao_adamw4bit" => OptimKind::TorchaoAdamW4bit,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            OptimKind::Sgd => "sgd",
            OptimKind::SgdMomentum => "sgd_momentum",
            OptimKind::Adam => "adam",
            OptimKind::AdamW => "adamw",
            OptimKind::Adam8bit => "adam8bit",
            OptimKind::AdamW8bit => "adamw8bit",
            OptimKind::PagedAdamW8bit => "paged_adamw8bit",
            OptimKind::TorchaoAdam8bit => "torchao_adam8bit",
            OptimKind::TorchaoAdamW8bit => "torchao_adamw8bit",
            OptimKind::TorchaoAdam4bit => "torchao_adam4bit",
            OptimKind::TorchaoAdamW4bit => "torchao_adamw4bit",
        }
    }

    pub fn kernel(self) -> &'static str {
        match self {
            OptimKind::Sgd | OptimKind::SgdMomentum => "sgd_step",
            OptimKind::Adam | OptimKind::AdamW => "adam_step",
            OptimKind::Adam8bit | OptimKind::AdamW8bit | OptimKind::PagedAdamW8bit => {
                "adam8bit_blockwise_step"
            }
            OptimKind::TorchaoAdam8bit
            | OptimKind::TorchaoAdamW8bit
            | OptimKind::TorchaoAdam4bit
            | OptimKind::TorchaoAdamW4bit => "torchao_single_param_adam",
        }
    }

    /// State tensors per parameter (momentum buffer; exp_avg and exp_avg_sq; the 8-bit
    /// optimizers' two states, in 8 bits with their block maxima or in 32 bits).
    pub fn states(self) -> usize {
        match self {
            OptimKind::Sgd => 0,
            OptimKind::SgdMomentum => 1,
            OptimKind::Adam
            | OptimKind::AdamW
            | OptimKind::Adam8bit
            | OptimKind::AdamW8bit
            | OptimKind::PagedAdamW8bit
            | OptimKind::TorchaoAdam8bit
            | OptimKind::TorchaoAdamW8bit
            | OptimKind::TorchaoAdam4bit
            | OptimKind::TorchaoAdamW4bit => 2,
        }
    }

    /// bitsandbytes' 8-bit optimizers.
    pub fn eight_bit(self) -> bool {
        matches!(
            self,
            OptimKind::Adam8bit | OptimKind::AdamW8bit | OptimKind::PagedAdamW8bit
        )
    }

    /// torchao's low-bit optimizers, with how they quantize.
    pub fn torchao(self) -> Option<LowBit> {
        match self {
            OptimKind::TorchaoAdam8bit | OptimKind::TorchaoAdamW8bit => Some(LowBit {
                bits: 8,
                block: 256,
                qmap: 256,
            }),
            OptimKind::TorchaoAdam4bit | OptimKind::TorchaoAdamW4bit => Some(LowBit {
                bits: 4,
                block: 128,
                qmap: 16,
            }),
            _ => None,
        }
    }

    /// An optimizer whose update gpumem runs on the simulated device only (its memory is
    /// modelled; no device has its kernel).
    pub fn simulated_only(self) -> bool {
        self.eight_bit() || self.torchao().is_some()
    }
}

/// One optimizer's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    pub lr: f64,
    pub momentum: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl Hyper {
    /// PyTorch's defaults: SGD lr 1e-3; Adam and AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8;
    /// AdamW weight_decay 0.01, the others 0.
    pub fn defaults(kind: OptimKind) -> Hyper {
        Hyper {
            lr: 1e-3,
            momentum: if kind == OptimKind::SgdMomentum {
                0.9
            } else {
                0.0
            },
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: if matches!(
                kind,
                OptimKind::AdamW
                    | OptimKind::AdamW8bit
                    | OptimKind::PagedAdamW8bit
                    | OptimKind::TorchaoAdamW8bit
                    | OptimKind::TorchaoAdamW4bit
            ) {
                0.01
            } else {
                0.0
            },
        }
    }
}

/// One parameter's update: kernel inputs are the gradient, then the state tensors; the output
/// is the parameter (written in place) followed by the state (written in place).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimStep {
    pub kind: OptimKind,
    pub hyper: Hyper,
    /// The step number, from 1 (Adam's bias correction; SGD's first momentum step).
    pub step: u64,
}
