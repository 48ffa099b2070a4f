// The user's own core/tensor.h: frugal's headers must never pick it up in place of their own.
#error "the consumer's own core/tensor.h was included: a frugal header resolved its include against the user's include path"
