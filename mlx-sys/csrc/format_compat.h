/* lmx: `{}` formatting for mlx-c's I/O messages, for standard libraries without <format> (g++ 12). */
#ifndef MLX_C_FORMAT_COMPAT_H
#define MLX_C_FORMAT_COMPAT_H

#include <sstream>
#include <string>
#include <string_view>

namespace mlx_c_compat {

inline void format_into(std::ostringstream& out, std::string_view pattern) {
  out << pattern;
}

template <typename First, typename... Rest>
void format_into(
    std::ostringstream& out,
    std::string_view pattern,
    const First& first,
    const Rest&... rest) {
  auto slot = pattern.find("{}");
  if (slot == std::string_view::npos) {
    out << pattern;
    return;
  }
  out << pattern.substr(0, slot) << first;
  format_into(out, pattern.substr(slot + 2), rest...);
}

/* Replaces each `{}` in `pattern` with the next argument, as std::format does for these messages. */
template <typename... Args>
std::string format(std::string_view pattern, const Args&... args) {
  std::ostringstream out;
  format_into(out, pattern, args...);
  return out.str();
}

} // namespace mlx_c_compat

#endif
