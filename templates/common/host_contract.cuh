// Checks that a kernel agrees with what the host computed for it (the host's contract):
// a template static_asserts its shared-memory size, block size, tile rows and
// signature against the values rendered into it, so a mismatch fails to compile.
namespace kgen {

template <class A, class B> struct SameType { static constexpr bool value = false; };
template <class A> struct SameType<A, A> { static constexpr bool value = true; };

}  // namespace kgen
