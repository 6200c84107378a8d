//! The script's operators on values: `-x`, `+ - * /` between tensors (broadcast) or a tensor
//! and a number (`x * 0.5`, `2 - x`), `@`, and `**` (a tensor to a number's power; numbers
//! among themselves as Python computes them).

use super::*;

impl Runner {
    pub(super) fn unary_op(&mut self, span: Span, op: Unary, t: TensorId) -> Flow<Value> {
        let r = self.op(span, op.name(), |d| d.unary(op, t));
        self.dev.release(t);
        r.map(Value::Tensor)
    }

    pub(super) fn binary(&mut self, span: Span, op: BinOp, a: Value, b: Value) -> Flow<Value> {
        if op == BinOp::Pow {
            return self.power(span, a, b);
        }
        match (a, b) {
            (Value::Tensor(x), Value::Tensor(y)) => {
                let r = self.binary_tensors(span, op, x, y);
                self.dev.release(x);
                self.dev.release(y);
                r
            }
            (a, b) if matches!((&a, &b), (Value::Tensor(_), s) | (s, Value::Tensor(_)) if s.as_f64().is_some()) =>
            {
                let (x, value, reversed) = match (a, b) {
                    (Value::Tensor(x), s) => (x, s.as_f64().expect("a number"), false),
                    (s, Value::Tensor(x)) => (x, s.as_f64().expect("a number"), true),
                    _ => unreachable!("one side is a tensor"),
                };
                if op == BinOp::MatMul {
                    self.dev.release(x);
                    return script(span, "matmul needs two tensors");
                }
                // a Python scalar becomes a 0-dim operand that keeps nothing alive
                let r = self.op(span, bop_name(op), |d| {
                    d.scalar(binop(op), x, value, reversed)
                });
                self.dev.release(x);
                r.map(Value::Tensor)
            }
            (Value::Int(x), Value::Int(y)) if op != BinOp::Div && op != BinOp::MatMul => {
                Ok(Value::Int(match op {
                    BinOp::Add => x.wrapping_add(y),
                    BinOp::Sub => x.wrapping_sub(y),
                    _ => x.wrapping_mul(y),
                }))
            }
            (a, b) => match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => Ok(Value::Float(match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::Pow => x.powf(y),
                    BinOp::MatMul => return script(span, "matmul needs two tensors"),
                })),
                _ => {
                    self.drop_value(a);
                    self.drop_value(b);
                    script(span, format!("unsupported operands for {}", op.symbol()))
                }
            },
        }
    }
}

impl Runner {
    /// `x op y` for two tensors (not `**`), which stay the caller's.
    pub(super) fn binary_tensors(
        &mut self,
        span: Span,
        op: BinOp,
        x: TensorId,
        y: TensorId,
    ) -> Flow<Value> {
        match op {
            BinOp::MatMul => self.op(span, "matmul", |d| {
                d.autocast_op(
                    crate::engine::autocast::CastPolicy::Lower,
                    &[x, y],
                    |d, i| d.matmul(i[0], i[1]),
                )
            }),
            _ => {
                let bop = binop(op);
                self.op(span, bop_name(op), |d| d.binary(bop, x, y))
            }
        }
        .map(Value::Tensor)
    }

    /// `a ** b`: `torch.pow(tensor, exponent)` for a tensor and a number (the `pow` op,
    /// with autocast's policy), the number for two numbers.
    pub(super) fn power(&mut self, span: Span, a: Value, b: Value) -> Flow<Value> {
        match (a, b) {
            (Value::Tensor(x), e) if e.as_f64().is_some() => {
                let op = crate::engine::op::Op::Pow {
                    exponent: e.as_f64().expect("a number"),
                };
                let r = self.op(span, "pow", |d| match op.autocast() {
                    Some(p) => d.autocast_op(p, &[x], |d, i| d.apply(&op, i)),
                    None => d.apply(&op, &[x]),
                });
                self.dev.release(x);
                r.map(Value::Tensor)
            }
            (Value::Int(x), Value::Int(y)) if y >= 0 => {
                match u32::try_from(y).ok().and_then(|y| x.checked_pow(y)) {
                    Some(v) => Ok(Value::Int(v)),
                    None => script(span, format!("{x} ** {y} overflows a 64-bit integer")),
                }
            }
            (a, b) => match (a.as_f64(), b.as_f64()) {
                (Some(x), Some(y)) => Ok(Value::Float(x.powf(y))),
                _ => {
                    self.drop_value(a);
                    self.drop_value(b);
                    script(
                        span,
                        "unsupported operands for **: a tensor to a number's power, or two numbers",
                    )
                }
            },
        }
    }
}

pub(super) fn binop(op: BinOp) -> Binary {
    match op {
        BinOp::Add => Binary::Add,
        BinOp::Sub => Binary::Sub,
        BinOp::Mul => Binary::Mul,
        BinOp::Div | BinOp::MatMul | BinOp::Pow => Binary::Div,
    }
}

pub(super) fn bop_name(op: BinOp) -> &'static str {
    match op {
        BinOp::Add => "add",
        BinOp::Sub => "sub",
        BinOp::Mul => "mul",
        BinOp::Div => "div",
        BinOp::MatMul => "matmul",
        BinOp::Pow => "pow",
    }
}
