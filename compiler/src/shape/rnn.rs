//! Recurrent ops: `LSTM`, `GRU`, `RNN` (ONNX layout 0: `X[seq, batch, input]`,
//! `Y[seq, num_directions, batch, hidden]`, `Y_h`/`Y_c[num_directions, batch, hidden]`;
//! layout 1: batch first, `Y[batch, seq, num_directions, hidden]`, `Y_h[batch, num_directions,
//! hidden]`).

use super::{node::Node, Rule};
use crate::error::Result;
use crate::ir::{Dim, TensorType};
use std::collections::HashMap;

/// Register this family.
pub fn register(r: &mut HashMap<&'static str, Rule>) {
    r.insert("LSTM", recurrent);
    r.insert("GRU", recurrent);
    r.insert("RNN", recurrent);
}

fn recurrent(n: &Node) -> Result<Vec<TensorType>> {
    let dt = n.dtype(0)?;
    let dirs = match n.str_attr("direction", "forward")? {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        d => return Err(n.err(format!("unknown direction '{d}'"))),
    };
    let hidden = match n.opt_int_attr("hidden_size")? {
        Some(h) => n.check_dim(h, "hidden_size")?,
        None => {
            // W is [num_directions, gates*hidden, input].
            let gates = match n.op_type() {
                "LSTM" => 4,
                "GRU" => 3,
                _ => 1,
            };
            match n.shape(1)?.and_then(|w| w.get(1)) {
                Some(d) => d.div(&Dim::Known(gates)).unwrap_or_else(|| n.fresh(3)),
                None => n.fresh(3),
            }
        }
    };
    let layout = n.int_attr("layout", 0)?;
    let Some(x) = n.shape(0)? else {
        return Ok(vec![TensorType::unranked(dt); 3]);
    };
    if x.len() != 3 {
        return Err(n.err(format!("X must be 3-D, got rank {}", x.len())));
    }
    let nd = Dim::Known(dirs);
    let (y, yh) = if layout == 0 {
        let (seq, batch) = (x[0].clone(), x[1].clone());
        (
            vec![seq, nd.clone(), batch.clone(), hidden.clone()],
            vec![nd, batch, hidden],
        )
    } else {
        let (batch, seq) = (x[0].clone(), x[1].clone());
        (
            vec![batch.clone(), seq, nd.clone(), hidden.clone()],
            vec![batch, nd, hidden],
        )
    };
    Ok(vec![
        TensorType::new(dt, y),
        TensorType::new(dt, yh.clone()),
        TensorType::new(dt, yh),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::testutil::T;
    use crate::ir::{Attr, DType};

    #[test]
    fn lstm_layouts() {
        let mut t = T::new();
        let x = t.input(DType::F32, "seq,b,3");
        let w = t.input(DType::F32, "2,16,3");
        let r = t.input(DType::F32, "2,16,4");
        let op = t.op(
            "LSTM",
            &[Some(x), Some(w), Some(r)],
            &[("direction", Attr::String("bidirectional".into()))],
            3,
        );
        assert_eq!(t.shapes(op, 14), ["seq,2,b,4", "2,b,4", "2,b,4"]);
        let xb = t.input(DType::F32, "b,seq,3");
        let op = t.op(
            "GRU",
            &[Some(xb), Some(w), Some(r)],
            &[("hidden_size", Attr::Int(5)), ("layout", Attr::Int(1))],
            2,
        );
        assert_eq!(t.shapes(op, 14), ["b,seq,1,5", "b,1,5"]);
    }
}
