"""Single sign-on: the portal as the OpenID provider that JupyterHub logs people in through."""
