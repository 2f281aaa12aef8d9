use mlx_rs::Array;
#[test]
fn adds() {
    let a = Array::from_slice(&[1.0f32, 2.0], &[2]);
    let b = a.add(&a).unwrap();
    b.eval().unwrap();
    assert_eq!(b.as_slice::<f32>(), &[2.0, 4.0]);
}
