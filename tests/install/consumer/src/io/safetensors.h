// The user's own io/safetensors.h: frugal's headers must never pick it up in place of their own.
#error "the consumer's own io/safetensors.h was included: a frugal header resolved its include against the user's include path"
