/* Copyright © 2023-2024 Apple Inc. */
/* lmx: mlx-c's half.h, extended so that the float16/bfloat16 accessors exist on every target. */

#ifndef MLX_HALF_H
#define MLX_HALF_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC) || defined(__aarch64__)
#define HAS_FLOAT16
#include <arm_fp16.h>
typedef __fp16 float16_t;
#endif

#if defined(__ARM_FEATURE_BF16) || defined(__aarch64__)
#define HAS_BFLOAT16
#include <arm_bf16.h>
typedef __bf16 bfloat16_t;
#endif

/*
 * Elsewhere the halves cross the C API by pointer only, so their bits are all that matters:
 * mlx-c's C++ sees them as 16-bit integers (MLX's own half types have the same layout), and the
 * C view that bindgen reads keeps the types bindgen maps as on aarch64 (a float16 newtype, u16).
 */
#ifndef HAS_FLOAT16
#define HAS_FLOAT16
#ifdef __cplusplus
#include <cstdint>
typedef uint16_t float16_t;
#else
typedef _Float16 float16_t;
#endif
#endif

#ifndef HAS_BFLOAT16
#define HAS_BFLOAT16
#ifdef __cplusplus
#include <cstdint>
typedef uint16_t bfloat16_t;
#else
typedef __bf16 bfloat16_t;
#endif
#endif

#ifdef __cplusplus
}
#endif

#endif
