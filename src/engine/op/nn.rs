//! Embedding lookup, dropout and masked_fill: `F.embedding` (keeps its indices for the
//! table's gradient), `F.dropout` in training (keeps a bool mask; the input itself when not
//! training) and `masked_fill` (keeps its mask).

use super::script::{tensors, Bound, Entry, Form, Made, Param, X};
use super::Op;

fn make(name: &'static str, b: &Bound<u32>) -> Result<Made<u32>, String> {
    let inputs = tensors(b);
    let op = match name {
        "embedding" => Op::Embedding,
        "masked_fill" => Op::MaskedFill {
            value: b.float(2).ok_or("masked_fill expects (mask, value)")?,
        },
        _ => {
            let p = b.float(1).unwrap_or(0.5);
            if !(0.0..=1.0).contains(&p) {
                return Err(format!(
                    "dropout probability has to be between 0 and 1, but got {p}"
                ));
            }
            if !b.flag(2) {
                // training=false: the input itself
                return Ok(Made::Same(inputs[0]));
            }
            // (the seed is numbered when the engine runs it)
            Op::Dropout { p, seed: 0 }
        }
    };
    Ok(Made::Op { op, inputs })
}

/// The script functions of the family.
pub(super) static ENTRIES: &[Entry] = &[
    Entry {
        name: "embedding",
        form: Form::Function,
        params: &[Param::Tensor("indices"), Param::Tensor("weight")],
        doc: "F.embedding (keeps the indices)",
        make,
    },
    Entry {
        name: "dropout",
        form: Form::Function,
        params: &[
            X,
            Param::Float("p", Some(0.5)),
            Param::Bool("training", true),
        ],
        doc: "F.dropout (keeps a bool mask)",
        make,
    },
    Entry {
        name: "masked_fill",
        form: Form::Method,
        params: &[X, Param::Tensor("mask"), Param::Float("value", None)],
        doc: "x where mask is false, value where true (use -inf for attention masks)",
        make,
    },
];
