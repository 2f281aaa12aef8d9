include!("mlx-sys/link_args.rs");

fn main() {
    mlx_link_args();
    lmx_grammar::build::compile_models("models");
}
