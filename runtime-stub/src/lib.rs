//! pipec's runtime: loads a compiled program and runs it (issues 3 and 7).
