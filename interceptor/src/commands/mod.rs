pub mod run;
pub mod status;
