// The user's own nn/module.h: frugal's headers must never pick it up in place of their own.
#error "the consumer's own nn/module.h was included: a frugal header resolved its include against the user's include path"
