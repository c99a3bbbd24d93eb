"""The hook machinery: the specifications every plugin implements, the plugin manager, and a model folder's sibling imports."""
