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
        }
    }

    pub fn kernel(self) -> &'static str {
        match self {
            OptimKind::Sgd | OptimKind::SgdMomentum => "sgd_step",
            OptimKind::Adam | OptimKind::AdamW => "adam_step",
            OptimKind::Adam8bit | OptimKind::AdamW8bit | OptimKind::PagedAdamW8bit => {
                "adam8bit_blockwise_step"
            }
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
            | OptimKind::PagedAdamW8bit => 2,
        }
    }

    /// bitsandbytes' 8-bit optimizers.
    pub fn eight_bit(self) -> bool {
        matches!(
            self,
            OptimKind::Adam8bit | OptimKind::AdamW8bit | OptimKind::PagedAdamW8bit
        )
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
                OptimKind::AdamW | OptimKind::AdamW8bit | OptimKind::PagedAdamW8bit
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
