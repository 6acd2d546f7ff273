//! pipec as a library: the compile pipeline ([`driver`]), the compiled program's folder
//! ([`artifact`]), the model front end ([`frontend`]) and the profiling engine ([`profile`]).
//! The `pipec` binary (`src/main.rs`, `src/cli/`) parses arguments, calls these and prints;
//! build pipelines call them directly (example in [`driver`]).

pub mod artifact;
pub mod driver;
pub mod frontend;
pub mod profile;
