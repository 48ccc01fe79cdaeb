"""The guest suite: its runner on the host and its pytest plugins.  Kept free of imports (the
package is copied into guests, where guest_plugin runs)."""
