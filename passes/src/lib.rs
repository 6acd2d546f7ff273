//! IR -> IR passes of pipec, one per file.

pub mod cost;
pub mod plan;
pub mod planners;
pub mod sim;
