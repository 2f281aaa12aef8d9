include!("../mlx-sys/link_args.rs");

fn main() {
    mlx_link_args("MLX");
}
