//! IR -> IR passes of pipec, one per file.
