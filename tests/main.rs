//! The integration tests, one crate: each `tests/*.rs` is a module of it, so the suite links
//! once and monomorphizes the runtime's generic code (trainers, steps, models) once, where a
//! crate per file linked 45 executables of its own copies. `cargo test --test integration NAME::`
//! runs one file's tests.

mod support;

mod allocator;
mod batch_generation;
mod bench_same_init;
mod bias_balancing;
mod cli_bpe_run;
mod cli_curriculum;
mod cli_data_parallel;
mod cli_end_to_end;
mod cli_hf;
mod cli_inputs;
mod cli_lora;
mod cli_mtp;
mod cli_objectives;
mod cli_own_models;
mod cli_quantize;
mod cli_runs;
mod cli_sft;
mod compiled_decode;
mod config_rules;
mod dropout;
mod flat_state;
mod frozen_step;
mod generation;
mod gpt2_init;
mod hf_models;
mod llama_two_front_ends;
mod lora;
mod macros_buffers;
mod macros_llama;
mod macros_model;
mod macros_scan;
mod macros_static_control_flow;
mod macros_transformer;
mod macros_ui;
mod models_recurrent;
mod models_reference;
mod models_tiny;
mod moe;
mod new_crate;
mod optimizer_defaults;
mod quantized_experts;
mod quantized_models;
mod routing;
mod serve;
mod speculative_and_search;
mod training_throughput;
