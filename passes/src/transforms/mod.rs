//! IR → IR transforms below the cost model: canonicalisation (`shape-infer`, `fold-constants`,
//! `dce`), lowering of ops without a kernel or gradient rule (`lower`), BaPipe's intra-layer
//! split (`split_layer`), and the training transforms (`autodiff`, `loss`, `optimizer`) that the
//! cost model (the backward graph it costs) and codegen (each stage's pieces) both run. They
//! import nothing from the planning layers (`cost`, `sim`, `plan`, `planners`, `codegen`).

pub mod autodiff;
pub mod dce;
pub mod fold_constants;
pub mod loss;
pub mod lower;
pub mod optimizer;
pub mod shape_infer;
pub mod split_layer;
