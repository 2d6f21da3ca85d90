"""datamask tests; subpackages mirror src/datamask/<pkg>/."""
